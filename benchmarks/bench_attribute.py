"""Cost of `fptrace attribute` against `fptrace run` on the bundled model (target ≤ 1.5×).

Method (figures in benchmarks/README.md): bundled model, float32, CPU, the prompt "The capital
of France is" and a 64-token prompt; in one process, after a warm-up of each, `run_trace` (the
whole run work, logit lens and lens metrics included) and `attribute` alternate 9 times;
medians and the ratio attribute / run.

Usage: python benchmarks/bench_attribute.py [--repeats 9]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()

    import torch

    from fptrace.commands.attribute.core import attribute
    from fptrace.models.loading import load_model
    from fptrace.core.trace import run_trace

    lm = load_model("smollm2-135m", device="cpu")
    g = torch.Generator().manual_seed(0)
    prompts = {"5 tokens": "The capital of France is",
               "64 tokens": torch.randint(100, lm.config.vocab_size, (64,), generator=g).tolist()}
    for label, prompt in prompts.items():
        run_trace(lm, prompt)
        attribute(lm, prompt)
        t_run, t_attr = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            run_trace(lm, prompt)
            t_run.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            attribute(lm, prompt)
            t_attr.append(time.perf_counter() - t0)
        r, a = statistics.median(t_run), statistics.median(t_attr)
        print(f"{label}: run {r * 1000:.1f} ms, attribute {a * 1000:.1f} ms, "
              f"ratio {a / r:.2f}")


if __name__ == "__main__":
    main()
