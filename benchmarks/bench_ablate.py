"""Batched `ablate --all-heads` against one forward pass per head, in one process (target ≥ 5×).

Method (figures in benchmarks/README.md): bundled model, float32, CPU, "The capital of France
is", every one of the 270 heads (30 blocks × 9) removed one at a time (zero ablation). After a
warm-up, `ablate(..., all_heads=True)` with --batch-size 1 (one forward pass per head, through
the same hooks: the loop a notebook would write) and with the batch sizes below alternate, 3
times each; medians; the grids are asserted equal to the one-by-one grid.

Usage: python benchmarks/bench_ablate.py [--sizes 16 32 64 270]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 270])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from fptrace.commands.ablate.core import ablate
    from fptrace.models.loading import load_model

    lm = load_model("smollm2-135m", device="cpu")
    prompt = "The capital of France is"
    ablate(lm, prompt, all_heads=True)  # warm-up
    times: dict[int, list[float]] = {1: [], **{bs: [] for bs in args.sizes}}
    grids = {}
    for _ in range(args.repeats):
        for bs in times:
            t0 = time.perf_counter()
            r = ablate(lm, prompt, all_heads=True, batch_size=bs)
            times[bs].append(time.perf_counter() - t0)
            grids[bs] = (r.head_grid, r.forward_passes)
    base = statistics.median(times[1])
    for bs, ts in times.items():
        grid, passes = grids[bs]
        for a, b in zip(grid, grids[1][0]):
            assert all(abs(x - y) <= 1e-3 * max(1.0, abs(y)) for x, y in zip(a, b))
        t = statistics.median(ts)
        print(f"--batch-size {bs:>3}: {t:6.2f} s, {passes:>3} forward passes "
              f"({base / t:.1f}× one pass per head)")


if __name__ == "__main__":
    main()
