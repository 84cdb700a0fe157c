"""Cost of the decomposition check (attn + mlp = Δ, on every trace) against a traced forward.

Method (figures in benchmarks/README.md):
- Bundled model (SmolLM2-135M, float32, CPU), random token ids of length T (default 512).
- In one process, after a warm-up: the traced forward (`run_trace(..., logit_lens=False)`:
  hooks, per-layer statistics and the check) is timed N times; the check alone
  (`stats.decomposition` on the (L, B, d) tensors the hooks captured, plus the comparison with
  its bound) is timed on the same captured tensors, repeated 1000 times per sample to rise above
  the timer's resolution. Medians; the ratio check / traced forward is the figure of merit
  (target < 2 %).

Usage: python benchmarks/bench_decomposition.py [--length 512] [--repeats 9]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()

    import torch

    from fptrace.core import stats
    from fptrace.core.hooks import Capture, capture_stats
    from fptrace.models.loading import load_model
    from fptrace.core.trace import run_trace

    lm = load_model("smollm2-135m", device="cpu")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, lm.config.vocab_size, (args.length,), generator=g).tolist()
    run_trace(lm, ids, logit_lens=False)  # warm-up

    traced = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        run_trace(lm, ids, logit_lens=False)
        traced.append(time.perf_counter() - t0)

    cap = Capture(mask=None)
    with torch.inference_mode(), capture_stats(lm.parts, cap):
        lm.model(torch.tensor([ids]), use_cache=False, logits_to_keep=1)
    streams = torch.stack([cap.embed_last, *cap.resid_last])  # (L+1, 1, d)
    attn, mlp = torch.stack(cap.attn_last), torch.stack(cap.mlp_last)  # (L, 1, d)
    inner = 1000
    check = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            mismatch, bound = stats.decomposition(streams[:-1], streams[1:], attn, mlp, "float32")
            bool((mismatch <= bound).all())
        check.append((time.perf_counter() - t0) / inner)
    t_traced, t_check = statistics.median(traced), statistics.median(check)
    print(f"T={args.length}: traced forward {t_traced * 1000:.1f} ms, decomposition check "
          f"{t_check * 1e6:.1f} µs, ratio {t_check / t_traced:.2e} ({t_check / t_traced:.4%})")


if __name__ == "__main__":
    main()
