"""Benchmark of `fptrace shapes --model llama-3.1-405b --seq-len 4096`.

Method: each measurement runs in a fresh process. We time (a) `import torch, transformers`
alone, and (b) the whole `fptrace shapes ... --json` command, reading the process's own clock
and its peak RSS (ru_maxrss of the child). The cost of fptrace beyond the imports is (b) − (a).
Medians of 5 runs each, interleaved.

Usage: python benchmarks/bench_shapes.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

IMPORT = "import torch, transformers, transformers.models.llama.modeling_llama"
SHAPES = ("import sys; from fptrace.cli.main import app; "
          "sys.argv = ['fptrace', 'shapes', '--model', 'llama-3.1-405b', '--seq-len', '4096', "
          "'--json']; app()")


def _run(code: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024  # MiB (ru_maxrss is KiB on Linux; max over children)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    imports, shapes = [], []
    for _ in range(a.runs):
        imports.append(_run(IMPORT)[0])
        shapes.append(_run(SHAPES)[0])
    # peak RSS of the shapes command alone, in a process of its own
    out = subprocess.run([sys.executable, "-c",
                          SHAPES.replace("app()", "") + "\nimport resource\n"
                          "try:\n    app()\nexcept SystemExit:\n    pass\n"
                          "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
                          "file=sys.stderr)"],
                         check=True, capture_output=True, text=True)
    peak_mib = int(out.stderr.strip().splitlines()[-1]) / 1024
    n_params = json.loads(out.stdout)["n_params"]
    mi, ms = statistics.median(imports), statistics.median(shapes)
    print(f"import torch+transformers: {mi:.2f} s (median of {a.runs})")
    print(f"fptrace shapes llama-3.1-405b --seq-len 4096: {ms:.2f} s wall, "
          f"{ms - mi:.2f} s beyond the imports; peak RSS {peak_mib:.0f} MiB; "
          f"{n_params:,} parameters")


if __name__ == "__main__":
    main()
