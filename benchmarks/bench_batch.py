"""Benchmark of `fptrace batch` on the bundled model (SmolLM2-135M, float32, CPU).

Method (figures in benchmarks/README.md):
- One process, one loaded model. 64 short prompts (4-9 tokens: factual-recall and
  "The capital of X is" prompts) go through the batch path, `run_batch` writing JSON Lines to a
  temporary file, at --batch-size 1 (one by one: the baseline) and at 8 (and 16, 32);
  the plain one-by-one loop of `run_trace` (what `fptrace run` does per prompt, without the
  JSON) is timed beside them.
- After one warm-up pass of each mode, the modes run in a rotating order for --repeats rounds;
  each figure is the median wall time of a whole pass over the 64 prompts, and the speed-up is
  the ratio of medians against batch-size 1 from the same process.
- The records of the batched pass are compared with the one-by-one pass (token ids equal, top-1
  equal, norms within 1e-4 relative), so a speed-up never comes from computing something else.

Usage: python benchmarks/bench_batch.py [--repeats 5] [--sizes 1 8 16 32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

SUBJECTS = ["France", "Germany", "Italy", "Spain", "Japan", "Canada", "Australia", "Egypt",
            "Brazil", "Russia", "China", "Portugal", "Norway", "Kenya", "Peru", "Greece"]
TEMPLATES = ["The capital of {} is", "The official language of {} is",
             "The largest city in {} is", "People from {} are called"]


def prompts() -> list[str]:
    return [t.format(s) for t in TEMPLATES for s in SUBJECTS]  # 64


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 16, 32])
    ap.add_argument("--json")
    args = ap.parse_args()

    import torch

    from fptrace.commands.batch.core import OutFile, run_batch
    from fptrace.core.inputs import PromptItem
    from fptrace.core.trace import run_trace
    from fptrace.models.loading import load_model

    torch.set_num_threads(os.cpu_count() or 1)
    lm = load_model("smollm2-135m", device="cpu")
    items = [PromptItem(f"p{i}", p, "bench:0") for i, p in enumerate(prompts())]
    n_tokens = [len(lm.tokenizer.encode(p)) for p in prompts()]
    tmp = tempfile.mkdtemp(prefix="fptrace-bench-")

    def batch_pass(size: int) -> tuple[float, list[dict]]:
        path = os.path.join(tmp, f"b{size}.jsonl")
        if os.path.exists(path):
            os.remove(path)
        out = OutFile(path).open()
        t0 = time.perf_counter()
        s = run_batch(lm, items, out.append, set(), batch_size=size)
        dt = time.perf_counter() - t0
        out.close()
        assert s.traced == len(items) and s.failed == 0
        with open(path, encoding="utf-8") as f:
            return dt, [json.loads(line) for line in f]

    def loop_pass() -> tuple[float, list]:
        t0 = time.perf_counter()
        traces = [run_trace(lm, it.prompt) for it in items]
        return time.perf_counter() - t0, traces

    modes = [f"batch-size {n}" for n in args.sizes] + ["run_trace loop"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    records: dict[str, list[dict]] = {}

    def once(mode: str) -> float:
        if mode == "run_trace loop":
            return loop_pass()[0]
        dt, recs = batch_pass(int(mode.split()[-1]))
        records[mode] = recs
        return dt

    for m in modes:  # warm-up
        once(m)
    for r in range(args.repeats):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for m in order:
            times[m].append(once(m))

    # the batched records are the one-by-one records
    base = records["batch-size 1"]
    for m, recs in records.items():
        for a, b in zip(recs, base):
            assert a["tokens"] == b["tokens"] and a["top_k"][0]["id"] == b["top_k"][0]["id"], m
            for la, lb in zip(a["layers"], b["layers"]):
                assert math.isclose(la["resid_norm_last"], lb["resid_norm_last"],
                                    rel_tol=1e-4, abs_tol=1e-4), m

    med = {m: statistics.median(v) for m, v in times.items()}
    ref = med["batch-size 1"]
    print(f"64 prompts, {sum(n_tokens)} tokens ({min(n_tokens)}-{max(n_tokens)} per prompt), "
          f"{args.repeats} repeats, torch threads {torch.get_num_threads()}")
    print(f"{'mode':<18} {'median s':>9} {'prompts/s':>10} {'speed-up vs b=1':>16}")
    for m in modes:
        print(f"{m:<18} {med[m]:>9.3f} {64 / med[m]:>10.1f} {ref / med[m]:>16.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"prompts": 64, "tokens": sum(n_tokens), "repeats": args.repeats,
                       "times_s": times, "median_s": med,
                       "speedup_vs_b1": {m: ref / med[m] for m in modes}}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
