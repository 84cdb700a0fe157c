"""Cost of `fptrace attribute --qk` (one head's score split) against `fptrace attribute` on the
bundled model (target ≤ 1.5×).

Method (figures in benchmarks/README.md): bundled model, float32, CPU; prompts "The capital of
France is" and 64 and 512 random tokens; heads 23.4 (the default key: the most attended) and
29.0 (the last block: every earlier block is split, the whole forward runs); in one process,
after a warm-up of each, `attribute` and `attribute_qk` alternate (attribute, qk 23.4, qk 29.0)
`--repeats` times; medians and the ratios qk / attribute.

Usage: python benchmarks/bench_attribute_qk.py [--repeats 9]
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

    from fptrace.addresses import Head
    from fptrace.commands.attribute.core import attribute
    from fptrace.commands.attribute.qk import attribute_qk
    from fptrace.models.loading import load_model

    lm = load_model("smollm2-135m", device="cpu")
    g = torch.Generator().manual_seed(0)
    prompts = {"5 tokens": "The capital of France is",
               "64 tokens": torch.randint(100, lm.config.vocab_size, (64,), generator=g).tolist(),
               "512 tokens": torch.randint(100, lm.config.vocab_size, (512,),
                                           generator=g).tolist()}
    heads = ((23, 4), (29, 0))
    for label, prompt in prompts.items():
        runs = {"attribute": lambda: attribute(lm, prompt)}
        for layer, head in heads:
            runs[f"qk {layer}.{head}"] = lambda layer=layer, head=head: attribute_qk(
                lm, prompt, Head(layer, head))
        times: dict[str, list[float]] = {name: [] for name in runs}
        for fn in runs.values():
            fn()
        for _ in range(args.repeats):
            for name, fn in runs.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        med = {name: statistics.median(t) for name, t in times.items()}
        base = med["attribute"]
        print(f"{label}: attribute {base * 1000:.1f} ms; " + "; ".join(
            f"{name} {m * 1000:.1f} ms ({m / base:.2f}×)" for name, m in med.items()
            if name != "attribute"))


if __name__ == "__main__":
    main()
