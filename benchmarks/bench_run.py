"""Benchmark of `fptrace run` on the bundled model (SmolLM2-135M, float32, CPU).

Method (see benchmarks/README.md for the figures):
- Each configuration runs in its own fresh process (`--worker`), so one run's memory and
  caches do not leak into another's.
- Time: in one process per prompt length T, the bare forward
  `model(input_ids, logits_to_keep=1, use_cache=False)` and the traced forward (the same call
  with fptrace's hooks and per-layer statistics, `run_trace(..., logit_lens=False)`) are run
  alternately after warm-up; we report medians and their ratio. The whole `run` work (with the
  logit lens over every layer) and an `output_hidden_states=True` forward are timed beside them.
- Memory: one process per (mode, T). The peak RSS (VmHWM) is reset through
  /proc/self/clear_refs after loading, and the extra memory of one forward is
  peak RSS during it minus RSS just before it.
- Load: cold (empty cache folder: GGUF dequantization + writing the cache) and warm (from the
  cache) load_model() in fresh processes; `fptrace --help` wall time, median of 7.

Usage: python benchmarks/bench_run.py [--lengths 16 512 2048] [--pairs 7] [--json out.json]
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

HERE = os.path.dirname(os.path.abspath(__file__))


def _rss_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")


def _ids(lm, T):
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randint(100, lm.config.vocab_size, (1, T), generator=g)


def _modes(lm, ids):
    import torch

    from fptrace.core.trace import run_trace

    model = lm.model
    ids_list = ids[0].tolist()

    def bare():
        with torch.inference_mode():
            model(ids, logits_to_keep=1, use_cache=False)

    def traced():
        run_trace(lm, ids_list, logit_lens=False)

    def run():
        run_trace(lm, ids_list, logit_lens=True)

    def hidden():
        with torch.inference_mode():
            model(ids, logits_to_keep=1, use_cache=False, output_hidden_states=True)

    return {"bare": bare, "traced": traced, "run": run, "hidden": hidden}


def worker_time(T: int, pairs: int) -> dict:
    from fptrace.models.loading import load_model

    lm = load_model()
    fns = _modes(lm, _ids(lm, T))
    for fn in fns.values():  # warm-up
        fn()
    times = {k: [] for k in fns}
    for _ in range(pairs):
        for k in ("bare", "traced", "run", "hidden", "traced", "bare"):  # balanced order
            t0 = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"T": T, "median_s": med,
            "ratio_traced": med["traced"] / med["bare"],
            "ratio_run": med["run"] / med["bare"],
            "ratio_hidden": med["hidden"] / med["bare"],
            "samples": {k: len(v) for k, v in times.items()}}


def worker_mem(T: int, mode: str) -> dict:
    from fptrace.models.loading import load_model

    lm = load_model()
    fn = _modes(lm, _ids(lm, T))[mode]
    fn()  # warm-up: allocator pools and lazy init are not counted
    _reset_peak()
    before = _rss_kib("VmRSS")
    fn()
    peak = _rss_kib("VmHWM")
    return {"T": T, "mode": mode, "extra_mib": (peak - before) / 1024}


def worker_load() -> dict:
    t0 = time.perf_counter()
    from fptrace.models.loading import load_model

    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    load_model()
    return {"import_s": t_import, "load_s": time.perf_counter() - t1}


def _spawn(args: list[str], env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True,
                         text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs="*")
    ap.add_argument("--lengths", nargs="*", type=int, default=[16, 512, 2048])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.worker is not None:
        kind, *rest = a.worker
        if kind == "time":
            res = worker_time(int(rest[0]), int(rest[1]))
        elif kind == "mem":
            res = worker_mem(int(rest[0]), rest[1])
        else:
            res = worker_load()
        print(json.dumps(res))
        return

    results: dict = {"time": [], "mem": [], "load": {}, "help_s": None}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, FPTRACE_CACHE_DIR=cache)
        results["load"]["cold"] = _spawn(["load"], env)
        results["load"]["warm"] = [_spawn(["load"], env) for _ in range(3)]
    for T in a.lengths:
        pairs = a.pairs if T <= 512 else max(3, a.pairs // 2)
        r = _spawn(["time", str(T), str(pairs)])
        results["time"].append(r)
        print(f"T={T:5d}  bare {r['median_s']['bare'] * 1e3:9.1f} ms  "
              f"traced x{r['ratio_traced']:.3f}  run (with logit lens) x{r['ratio_run']:.3f}  "
              f"output_hidden_states x{r['ratio_hidden']:.3f}", flush=True)
        mem = {m: _spawn(["mem", str(T), m])["extra_mib"] for m in ("bare", "traced", "hidden")}
        results["mem"].append({"T": T, **mem})
        print(f"         peak extra RSS: bare {mem['bare']:.1f} MiB  traced "
              f"{mem['traced']:.1f} MiB  output_hidden_states {mem['hidden']:.1f} MiB",
              flush=True)
    helps = []
    for _ in range(7):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "fptrace", "--help"], capture_output=True,
                       check=True)
        helps.append(time.perf_counter() - t0)
    results["help_s"] = statistics.median(helps)
    cold, warm = results["load"]["cold"], results["load"]["warm"]
    print(f"load: cold {cold['load_s']:.1f} s, warm {statistics.median(w['load_s'] for w in warm):.2f} s"
          f" (median of 3; importing fptrace.models.loading {cold['import_s']:.2f} s)")
    print(f"fptrace --help: {results['help_s']:.3f} s (median of 7)")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
