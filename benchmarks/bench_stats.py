"""Benchmark of `fptrace stats` on the bundled model (SmolLM2-135M, float32, CPU): its time
against `batch` on the same prompts, and its peak memory for 100 and 1,000 prompts.

Method (figures in benchmarks/README.md):
- Time: one process, one loaded model. Two prompt sets: the 64 short prompts of
  bench_batch.py (5-9 tokens) and 64 longer ones (the same facts in sentences of 40-70
  tokens). Each goes through the batch path (`run_batch` writing JSON Lines to a temporary file,
  what `fptrace batch` does) and the stats path (`collect` into fresh statistics, what
  `fptrace stats` does, with and without the attention sinks), all at --batch-size 8. After a
  warm-up pass of every mode, the modes run in a rotating order for --repeats rounds; each figure
  is the median wall time of a whole pass, and the ratio is against batch from the same process.
- Memory: one fresh process per prompt count (`--worker mem N`): it loads the model, counts N
  prompts (the short prompts, cycled, each with its own id) at --batch-size 8, writes the
  statistics file, and reports its peak RSS (VmHWM) and the RSS after loading. The statistics
  kept do not grow with N, so neither should the peak.

Usage: python benchmarks/bench_stats.py [--repeats 3] [--threads T] [--counts N ...]
                                       [--json out.json]
       python benchmarks/bench_stats.py --worker mem N
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_batch import SUBJECTS, TEMPLATES, prompts  # noqa: E402

LONG = ("In a short report for a school project about {}, a student wrote that the country is "
        "known for its history, its food and its people, and then asked the teacher which city "
        "was its capital and what language most people speak there, because the textbook did "
        "not say")


def long_prompts() -> list[str]:
    return [LONG.format(s) + ("." if k % 2 else " clearly.") for k, s in
            enumerate(SUBJECTS * 4)]  # 64


def rss_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def mem_worker(n: int) -> None:
    from fptrace.commands.stats.core import build, collect, new_statistics, write_stats
    from fptrace.core.inputs import PromptItem
    from fptrace.core.trace import model_info
    from fptrace.models.loading import load_model

    lm = load_model("smollm2-135m", device="cpu")
    loaded = rss_kib("VmRSS")
    base = prompts()
    items = [PromptItem(f"p{i}", base[i % len(base)], "bench:0") for i in range(n)]
    stats = new_statistics(lm)
    t0 = time.perf_counter()
    s = collect(lm, items, stats, batch_size=8)
    assert s.traced == n
    with tempfile.TemporaryDirectory() as tmp:
        write_stats(os.path.join(tmp, "s.json"), build(stats, model_info(lm)))
    print(json.dumps({"prompts": n, "peak_kib": rss_kib("VmHWM"), "loaded_kib": loaded,
                      "seconds": time.perf_counter() - t0}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--worker", nargs=2)
    ap.add_argument("--counts", type=int, nargs="*", default=[100, 1000],
                    help="prompt counts of the memory runs (none: skip them)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch's intra-op threads (0: one per core); 1 keeps the figures "
                    "steady on a shared machine")
    args = ap.parse_args()
    if args.worker:
        mem_worker(int(args.worker[1]))
        return

    import torch

    from fptrace.commands.batch.core import OutFile, run_batch
    from fptrace.commands.stats.core import collect, new_statistics
    from fptrace.core.inputs import PromptItem
    from fptrace.models.loading import load_model

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    lm = load_model("smollm2-135m", device="cpu")
    tmp = tempfile.mkdtemp(prefix="fptrace-bench-")
    sets = {"short": prompts(), "long": long_prompts()}
    n_tokens = {k: [len(lm.tokenizer.encode(p)) for p in v] for k, v in sets.items()}

    def batch_pass(items: list) -> float:
        path = os.path.join(tmp, "b.jsonl")
        if os.path.exists(path):
            os.remove(path)
        out = OutFile(path).open()
        t0 = time.perf_counter()
        s = run_batch(lm, items, out.append, set(), batch_size=8)
        dt = time.perf_counter() - t0
        out.close()
        assert s.traced == len(items)
        return dt

    def stats_pass(items: list, sinks: bool) -> float:
        st = new_statistics(lm, sinks)
        t0 = time.perf_counter()
        s = collect(lm, items, st, batch_size=8)
        assert s.traced == len(items)
        return time.perf_counter() - t0

    results = {}
    for name, texts in sets.items():
        items = [PromptItem(f"p{i}", p, "bench:0") for i, p in enumerate(texts)]
        modes = {"batch": lambda: batch_pass(items), "stats": lambda: stats_pass(items, True),
                 "stats --no-sinks": lambda: stats_pass(items, False)}
        times: dict[str, list[float]] = {m: [] for m in modes}
        for f in modes.values():  # warm-up
            f()
        for r in range(args.repeats):
            order = list(modes)[r % len(modes):] + list(modes)[:r % len(modes)]
            for m in order:
                times[m].append(modes[m]())
        med = {m: statistics.median(v) for m, v in times.items()}
        results[name] = {"tokens": sum(n_tokens[name]), "times_s": times, "median_s": med,
                         "ratio_vs_batch": {m: med[m] / med["batch"] for m in modes}}
        print(f"{name}: 64 prompts, {sum(n_tokens[name])} tokens "
              f"({min(n_tokens[name])}-{max(n_tokens[name])} per prompt), {args.repeats} "
              f"repeats, torch threads {torch.get_num_threads()}")
        for m in modes:
            print(f"  {m:<18} {med[m]:8.3f} s   {med[m] / med['batch']:5.2f}× batch")

    mem = []
    for n in args.counts:
        r = subprocess.run([sys.executable, __file__, "--worker", "mem", str(n)],
                           capture_output=True, text=True, check=True)
        mem.append(json.loads(r.stdout.strip().splitlines()[-1]))
        m = mem[-1]
        print(f"memory: {n} prompts: peak RSS {m['peak_kib'] / 1024:.1f} MiB (after load "
              f"{m['loaded_kib'] / 1024:.1f} MiB), {m['seconds']:.1f} s")
    if len(mem) >= 2:
        a, b = mem[0]["peak_kib"], mem[-1]["peak_kib"]
        print(f"memory: peak RSS {mem[-1]['prompts']} vs {mem[0]['prompts']} prompts: "
              f"{(b - a) / a:+.1%}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"speed": results, "memory": mem}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
