"""Benchmark of the resident server (`fptrace serve`): what a call costs with and without one.

Method (figures in benchmarks/README.md, raw numbers with --json):
- Every call is a fresh process, timed from its start to its exit (wall), on the bundled model
  (SmolLM2-135M-Instruct, float32, CPU, its weights cache warm), prompt "The capital of France
  is", stdout to /dev/null.
- Client import: `python -c "import fptrace.client"` against a bare `python -c pass`, and the
  modules the client imported (none of torch, transformers, Typer, rich).
- Rounds, `--rounds` times, in turn: the plain script (imports transformers, loads the same
  weights from fptrace's cache folder with from_pretrained, runs one forward: the floor of any
  process that computes the answer), `fptrace run` in its own process (FPTRACE_SERVER=off), and
  `fptrace run` answered by a server that holds the model; also `fptrace --help` both ways.
  Medians; ratios of `fptrace run` (no server) to the plain script, same rounds.
- First call with a server: a server is started (not timed) and the first `fptrace run` that
  makes it load the model is timed; then the second.

Usage: python benchmarks/bench_serve.py [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PROMPT = "The capital of France is"
PLAIN = """
import sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder = sys.argv[1]
tok = AutoTokenizer.from_pretrained(folder + "/tokenizer")
model = AutoModelForCausalLM.from_pretrained(folder + "/model", dtype=torch.float32).eval()
with torch.no_grad():
    logits = model(**tok(sys.argv[2], return_tensors="pt")).logits
print(int(logits[0, -1].argmax()))
"""


def wall(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          timeout=600)
    t = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed: {done.stderr.decode()[-400:]}")
    return t


def cache_folder() -> str:
    """The bundled model's dequantized weights and tokenizer, as fptrace caches them (two HF
    folders, model/ and tokenizer/)."""
    from fptrace.models.gguf_cache import gguf_entry
    from fptrace.models.registry import known_models

    return gguf_entry(known_models()["smollm2-135m"].gguf_path())


def start_server(env: dict) -> int:
    subprocess.run([sys.executable, "-m", "fptrace", "serve"], env=env, check=True,
                   capture_output=True, timeout=300)
    status = subprocess.run([sys.executable, "-m", "fptrace", "serve", "--status", "--json"],
                            env=env, capture_output=True, text=True, check=True)
    return json.loads(status.stdout)["pid"]


def stop_server(env: dict, pid: int) -> None:
    subprocess.run([sys.executable, "-m", "fptrace", "serve", "--stop"], env=env,
                   capture_output=True, timeout=120)
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    py = sys.executable
    folder = tempfile.mkdtemp(prefix="fptrace-bench-serve-")
    base = dict(os.environ, FPTRACE_SOCKET=os.path.join(folder, "run", "s.sock"))
    here = dict(base, FPTRACE_SERVER="off")
    fptrace = [py, "-m", "fptrace"]
    run = [*fptrace, "run", PROMPT]
    weights = cache_folder()
    wall(run, here)  # the cache is warm, the disk too

    res: dict = {"rounds": args.rounds}
    bare = [wall([py, "-c", "pass"], base) for _ in range(7)]
    client = [wall([py, "-c", "import fptrace.client"], base) for _ in range(7)]
    probe = subprocess.run([py, "-c", "import sys, fptrace.client; print(sorted(m for m in "
                            "('torch', 'transformers', 'typer', 'rich', 'numpy') if m in "
                            "sys.modules))"], env=base, capture_output=True, text=True)
    res["python_start_s"] = statistics.median(bare)
    res["client_import_s"] = statistics.median(client)
    res["client_heavy_modules"] = probe.stdout.strip()

    pid = start_server(base)
    try:
        res["first_call_with_server_s"] = wall(run, base)  # the server loads the model
        res["second_call_with_server_s"] = wall(run, base)
        rows: dict[str, list[float]] = {k: [] for k in (
            "plain_script", "run_no_server", "run_server", "help_no_server", "help_server")}
        for _ in range(args.rounds):
            rows["plain_script"].append(wall([py, "-c", PLAIN, weights, PROMPT], base))
            rows["run_no_server"].append(wall(run, here))
            rows["run_server"].append(wall(run, base))
            rows["help_no_server"].append(wall([*fptrace, "--help"], here))
            rows["help_server"].append(wall([*fptrace, "--help"], base))
    finally:
        stop_server(base, pid)
        shutil.rmtree(folder, ignore_errors=True)
    for k, v in rows.items():
        res[k + "_s"] = statistics.median(v)
        res[k + "_all"] = [round(x, 3) for x in v]
    ratios = [a / b for a, b in zip(rows["run_no_server"], rows["plain_script"])]
    res["run_no_server_over_plain"] = statistics.median(ratios)
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
