"""Batched causal tracing against the one-by-one loop, in one process (target ≥ 5×).

Method (figures in benchmarks/README.md): bundled model, float32, CPU, "The capital of France
is" with noise on " France" (a 30 × 5 grid: 150 patched runs). After a warm-up, `patch()` with
--batch-size 1 (one forward pass per cell: the loop a notebook would write, through the same
hooks) and with the batch sizes below are timed alternately, 3 times each; medians; the grids
are asserted equal.

Usage: python benchmarks/bench_patch.py [--sizes 16 32 64 150]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 150])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from fptrace.models.loading import load_model
    from fptrace.commands.patch.core import patch

    lm = load_model("smollm2-135m", device="cpu")
    prompt, subject = "The capital of France is", " France"
    patch(lm, prompt, noise=subject, batch_size=32)  # warm-up
    times: dict[int, list[float]] = {1: []}
    for bs in args.sizes:
        times[bs] = []
    grids = {}
    for _ in range(args.repeats):
        for bs in times:
            t0 = time.perf_counter()
            r = patch(lm, prompt, noise=subject, batch_size=bs)
            times[bs].append(time.perf_counter() - t0)
            grids[bs] = r.grid
    base = statistics.median(times[1])
    for bs, ts in times.items():
        for a, b in zip(grids[bs], grids[1]):
            assert all(abs(x - y) <= 1e-4 * max(1.0, abs(y)) for x, y in zip(a, b))
        t = statistics.median(ts)
        print(f"--batch-size {bs:>3}: {t:6.2f} s  ({base / t:.1f}× the one-by-one loop)")


if __name__ == "__main__":
    main()
