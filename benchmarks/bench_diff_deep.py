"""Benchmark of `fptrace diff --deep` against a plain `fptrace diff` on the bundled model.

Method (figures in benchmarks/README.md): one process; the bundled model (SmolLM2-135M, CPU)
loaded as side a (float32) and as side b (float32 again, or another setting with --b); after a
warm-up of each, in a rotating order, `--rounds` times:
- plain: what `fptrace diff PROMPT --model-b ...` does once both models are loaded: `run_trace`
  on a, then on b (with the whole stream kept, `snippet=d`), both as JSON dicts, `diff_traces`;
- deep: `deep_diff` (both passes side by side in lockstep, every block's points compared, the
  logit-lens KL and the error's channels of every layer), the same block-level table included;
- deep 3 blocks: `deep_diff(..., layers=[0, 1, 2])`.
Medians; the ratio is against plain in the same process. The peak of Python-visible tensor
memory is not measured here (one block's points: a few hundred KiB at this prompt length).

Usage: python benchmarks/bench_diff_deep.py [--rounds 7] [--b float32|bfloat16|int8]
       [--tokens N (random token ids instead of the prompt)] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

PROMPT = "The capital of France is"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--b", default="float32", choices=("float32", "bfloat16", "int8"))
    ap.add_argument("--tokens", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch's intra-op threads (0: its "
                    "default)")
    args = ap.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from fptrace.commands.diff.core import diff_traces
    from fptrace.commands.diff.deep import deep_diff
    from fptrace.core.trace import run_trace
    from fptrace.models.loading import load_model
    from fptrace.render.json import to_dict

    a = load_model("smollm2-135m", device="cpu")
    b = load_model("smollm2-135m", device="cpu",
                   **({"quantize": "int8"} if args.b == "int8" else {"dtype": args.b}))
    prompt = PROMPT
    if args.tokens:
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(100, a.config.vocab_size, (args.tokens,), generator=g).tolist()
    d = int(a.config.hidden_size)

    def plain():
        ta = to_dict(run_trace(a, prompt, snippet=d))
        tb = to_dict(run_trace(b, prompt, snippet=d))
        diff_traces(ta, tb, same_input=True)

    modes = {"plain": plain, "deep": lambda: deep_diff(a, b, prompt),
             "deep 3 blocks": lambda: deep_diff(a, b, prompt, layers=[0, 1, 2])}
    for fn in modes.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {m: [] for m in modes}
    names = list(modes)
    for r in range(args.rounds):
        for m in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            modes[m]()
            times[m].append(time.perf_counter() - t0)
    base = statistics.median(times["plain"])
    n = len(a.encode(prompt))
    print(f"side b: {args.b}; {n} tokens; {args.rounds} rounds; torch threads "
          f"{torch.get_num_threads()}")
    print("| mode | median | / plain |")
    print("| --- | ---: | ---: |")
    for m in names:
        med = statistics.median(times[m])
        print(f"| {m} | {med * 1000:.0f} ms | {med / base:.2f} |")


if __name__ == "__main__":
    main()
