"""One command for a machine with a CUDA GPU: run the tests marked `gpu`, trace the bundled
model and a 1B-parameter random-weight Llama (llama-3.2-1b config) in bfloat16, and measure
the trace overhead against a bare forward with CUDA events.

Usage (from the repository root, with the project installed: `make install`):
    python benchmarks/gpu_check.py [--json benchmarks/results-gpu.json]

Method of the overhead figure: for T in (16, 512), after 5 warm-up calls of each, the bare
forward `model(ids, logits_to_keep=1, use_cache=False)` and the traced forward
(`run_trace(..., logit_lens=False)`: hooks on every block plus the per-layer statistics) are
timed alternately 20 times each with torch.cuda.Event pairs (synchronised); the ratio of the
medians is the overhead (target ≤ 1.05). Takes a few minutes, most of it the tests and loading.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cuda_ms(fn, n: int) -> list[float]:
    import torch

    out = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return out


def overhead(lm, T: int, repeats: int = 20) -> dict:
    import torch

    from fptrace.tracer import run_trace

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, lm.config.vocab_size, (1, T), generator=g)
    ids_dev = ids.to(lm.device)
    ids_list = ids[0].tolist()

    def bare():
        with torch.inference_mode():
            lm.model(ids_dev, logits_to_keep=1, use_cache=False)

    def traced():
        run_trace(lm, ids_list, logit_lens=False)

    for _ in range(5):
        bare()
        traced()
    b, t = [], []
    for _ in range(repeats):
        b += cuda_ms(bare, 1)
        t += cuda_ms(traced, 1)
    mb, mt = statistics.median(b), statistics.median(t)
    return {"T": T, "bare_ms": mb, "traced_ms": mt, "ratio": mt / mb}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--skip-tests", action="store_true")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU visible: nothing to check here", file=sys.stderr)
        return 2
    report: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    print(f"GPU: {report['gpu']}  torch {report['torch']}")
    if not args.skip_tests:
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-m", "gpu",
                              "tests/test_gpu.py"], cwd=ROOT)
        report["gpu_tests"] = {"exit_code": rc, "seconds": time.perf_counter() - t0}
        print(f"gpu tests: exit code {rc}")

    from fptrace.models.loading import load_model
    from fptrace.tracer import run_trace

    t0 = time.perf_counter()
    small = load_model("smollm2-135m", device="cuda", dtype="auto")
    tr = run_trace(small, "The capital of France is")
    report["bundled"] = {"dtype": tr.model.dtype, "top1": tr.top_k[0].text,
                         "p": tr.top_k[0].prob, "load_and_trace_s": time.perf_counter() - t0}
    print(f"bundled: {tr.model.dtype} top-1 {tr.top_k[0].text!r} p={tr.top_k[0].prob:.4f}")
    report["bundled_overhead"] = [overhead(small, T) for T in (16, 512)]

    big = load_model("llama-3.2-1b", random_weights=True, device="cuda", dtype="bfloat16")
    report["llama_1b_bf16"] = [overhead(big, T) for T in (16, 512)]
    for name in ("bundled_overhead", "llama_1b_bf16"):
        for row in report[name]:
            print(f"{name:>17} T={row['T']:>4}: bare {row['bare_ms']:.2f} ms, traced "
                  f"{row['traced_ms']:.2f} ms, ratio {row['ratio']:.3f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return int(report.get("gpu_tests", {}).get("exit_code", 0) != 0)


if __name__ == "__main__":
    sys.exit(main())
