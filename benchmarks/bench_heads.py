"""Benchmark of `fptrace heads` on the bundled model (SmolLM2-135M, float32, CPU): all 270
heads, the pattern scores over the shipped prompts plus 8 induction sequences of 2 × 64 tokens,
the OV scores and the checks by intervention, against `fptrace stats` over the same prompts.

Method (figures in benchmarks/README.md): one process, one loaded model. After a warm-up pass of
stats (the first forward pages the weights in), the modes run in the order stats, heads, stats
for --repeats rounds; each figure is the wall time of a whole pass (heads: `heads()` with its
defaults, what `fptrace heads` does; stats: `activation_stats()` at batch size 8, what
`fptrace stats` does), the ratio heads / the median of the stats passes. heads' phases are timed
by wrapping its functions: the prompts' attention passes, the induction sequences' passes, the
induction check (one row per candidate head and sequence), the previous-token check, the OV
scores.

Usage: python benchmarks/bench_heads.py [--repeats 1] [--threads T] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from fptrace.commands.heads import checks, core, weights
    from fptrace.commands.heads.inputs import read_prompts
    from fptrace.commands.stats.core import activation_stats
    from fptrace.models.loading import load_model

    lm = load_model("smollm2-135m")
    texts, subjects = read_prompts([])
    tokens = sum(len(lm.prepare(t).ids) for t in texts)
    phases: dict[str, float] = {}

    def timed(module, name, label=None):
        f = getattr(module, name)

        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                key = label(k) if label else name
                phases[key] = phases.get(key, 0.0) + time.perf_counter() - t
        setattr(module, name, wrapper)

    timed(core, "attention", lambda k: "attention: induction sequences" if "keep" in k
          else "attention: prompts")
    timed(checks, "induction_check")
    timed(checks, "previous_check")
    timed(weights, "ov_scores")

    def run_stats() -> float:
        t = time.perf_counter()
        activation_stats(lm, texts, batch_size=8)
        return time.perf_counter() - t

    def run_heads() -> tuple[float, object]:
        t = time.perf_counter()
        r = core.heads(lm, texts, subjects=subjects, induction=8, induction_length=64)
        return time.perf_counter() - t, r

    run_stats()  # warm-up
    st, hd = [], []
    result = None
    for _ in range(args.repeats):
        st.append(run_stats())
        phases.clear()
        t, result = run_heads()
        hd.append(t)
        st.append(run_stats())
    s, h = statistics.median(st), statistics.median(hd)
    candidates = {"induction": sum(x.loss_change is not None for x in result.heads),
                  "previous-token": sum(x.next_share is not None for x in result.heads)}
    out = {"prompts": len(texts), "prompt_tokens": tokens, "threads": torch.get_num_threads(),
           "stats_s": st, "heads_s": hd, "ratio": h / s, "heads_phases_s": phases,
           "checked_heads": candidates}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
