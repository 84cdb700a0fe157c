"""Benchmark of `fptrace generate` against `model.generate` on the bundled model (SmolLM2-135M,
float32, CPU), in the same process.

Method (figures in benchmarks/README.md):
- Greedy decoding of the same prompt; every mode is forced to produce exactly N new tokens
  (`min_new_tokens` for model.generate, `stop_at_eos=False` for fptrace). The tokens must agree
  up to the first end-of-sequence token (beyond it, min_new_tokens bans EOS and the others
  do not).
- Decode throughput is measured the same way for every mode, from wall times outside it:
  (N − 1) / (time for N tokens − time for 1 token), so the prefill cancels out.
- Modes: `model.generate(do_sample=False)`; fptrace `generate` (hooks, KV-cache reading,
  alternatives, timing); fptrace `generate --layers` (per-layer statistics and logit lens at
  every step); and a bare loop (forward with a DynamicCache + argmax) as the floor.
- After a warm-up of each mode, the modes alternate in a rotating order for --repeats rounds;
  medians. The tokens of every mode are checked equal to model.generate's.

Usage: python benchmarks/bench_generate.py [--tokens 33] [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

PROMPT = "Once upon a time, in a small village, there lived"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=33)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()

    import torch
    from transformers import DynamicCache

    from fptrace.commands.generate.core import generate
    from fptrace.models.loading import load_model

    torch.set_num_threads(os.cpu_count() or 1)
    lm = load_model("smollm2-135m", device="cpu")
    ids = lm.tokenizer.encode(PROMPT)
    model = lm.model

    def hf(n: int) -> list[int]:
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n,
                                 min_new_tokens=n)
        return out[0, len(ids):].tolist()

    def ours(n: int, layers: bool = False) -> list[int]:
        g = generate(lm, PROMPT, max_new_tokens=n, stop_at_eos=False, layers=layers)
        return [t.id for t in g.generated]

    def bare(n: int) -> list[int]:
        cache = DynamicCache(config=lm.config)
        x = torch.tensor([ids])
        new = []
        with torch.inference_mode():
            for _ in range(n):
                logits = model(x, cache=cache, use_cache=True, logits_to_keep=1).logits
                t = int(logits[0, -1].argmax())
                new.append(t)
                x = torch.tensor([[t]])
        return new

    modes = {"model.generate": hf, "fptrace generate": ours,
             "fptrace generate --layers": lambda n: ours(n, True), "bare loop": bare}
    N = args.tokens
    ref = hf(N)
    eos = {2, lm.config.eos_token_id, model.generation_config.eos_token_id} - {None}
    agree = next((i for i, t in enumerate(ref) if t in eos), N)  # min_new_tokens hides EOS
    for name, fn in modes.items():  # warm-up, and the tokens agree up to any EOS
        got = fn(N)
        assert got[:agree] == ref[:agree] and len(got) == N, name
        fn(1)
    t_n: dict[str, list[float]] = {m: [] for m in modes}
    t_1: dict[str, list[float]] = {m: [] for m in modes}
    names = list(modes)
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for n, store in ((1, t_1), (N, t_n)):
                t0 = time.perf_counter()
                modes[name](n)
                store[name].append(time.perf_counter() - t0)
    rate = {m: (N - 1) / (statistics.median(t_n[m]) - statistics.median(t_1[m])) for m in modes}
    base = rate["model.generate"]
    print(f"greedy, {len(ids)}-token prompt, {N} new tokens, {args.repeats} repeats, "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'mode':<27} {'prefill+1 ms':>12} {'decode tok/s':>13} {'vs model.generate':>18}")
    for m in modes:
        print(f"{m:<27} {statistics.median(t_1[m]) * 1000:>12.1f} {rate[m]:>13.2f} "
              f"{rate[m] / base:>18.3f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"tokens": N, "repeats": args.repeats, "t_n_s": t_n, "t_1_s": t_1,
                       "decode_tokens_per_s": rate,
                       "ratio_vs_model_generate": {m: rate[m] / base for m in modes}}, f,
                      indent=2)


if __name__ == "__main__":
    sys.exit(main())
