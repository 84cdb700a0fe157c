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
scores. Each figure is also taken in the process's CPU time (`time.process_time`: user and
system time of all its threads): on a shared machine the wall time also counts the time other
processes held the cores, the CPU time does not (at one thread, the CPU ratio is the one a quiet
machine would show, up to what the neighbours' use of the caches and memory adds).

With --commands, the two commands as a user runs them instead, each a fresh process timed from
its start to its exit (wall; stdout to /dev/null): `fptrace stats prompts/` (no --out: writing
the statistics file would lengthen stats) and `fptrace heads` (its defaults: the same 41
prompts), first each in a process of its own (FPTRACE_SERVER=off: import, model load and the
work), then answered by a resident server that holds the model (`fptrace serve` on a private
socket, started and warmed by one call of each, stopped by its process id at the end); the
two alternate for --repeats rounds; ratios of the medians.

Usage: python benchmarks/bench_heads.py [--repeats 1] [--threads T] [--commands] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = str(Path(__file__).resolve().parents[1] / "prompts")


def commands(repeats: int) -> dict:
    """The commands' wall times, in processes of their own and answered by a resident server
    (bench_serve.py's timing and server start and stop)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from bench_serve import start_server, stop_server, wall

    py = [sys.executable, "-m", "fptrace"]
    folder = tempfile.mkdtemp(prefix="fptrace-bench-heads-")
    served = dict(os.environ, FPTRACE_SOCKET=os.path.join(folder, "run", "s.sock"))
    alone = dict(served, FPTRACE_SERVER="off")
    stats, heads = [*py, "stats", PROMPTS], [*py, "heads"]
    out: dict = {"repeats": repeats}
    pid = None
    try:
        for mode, env in (("own process", alone), ("resident server", served)):
            if env is served:
                pid = start_server(env)
            wall(stats, env)  # warm: the weights' cache and disk; the server loads the model
            wall(heads, env)
            st, hd = [], []
            for _ in range(repeats):
                st.append(wall(stats, env))
                hd.append(wall(heads, env))
                st.append(wall(stats, env))
            out[mode] = {"stats_s": [round(x, 3) for x in st],
                         "heads_s": [round(x, 3) for x in hd],
                         "ratio": statistics.median(hd) / statistics.median(st)}
    finally:
        if pid is not None:
            stop_server(served, pid)
        shutil.rmtree(folder, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--commands", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.commands:
        res = commands(args.repeats)
        res["load_average"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(res, indent=1))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(res, f, indent=1)
        return
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
    cpu_phases: dict[str, float] = {}

    def timed(module, name, label=None):
        f = getattr(module, name)

        def wrapper(*a, **k):
            t, c = time.perf_counter(), time.process_time()
            try:
                return f(*a, **k)
            finally:
                key = label(k) if label else name
                phases[key] = phases.get(key, 0.0) + time.perf_counter() - t
                cpu_phases[key] = cpu_phases.get(key, 0.0) + time.process_time() - c
        setattr(module, name, wrapper)

    timed(core, "attention", lambda k: "attention: induction sequences"
          if "keep" in k or "final" in k else "attention: prompts")
    timed(checks, "induction_check")
    timed(checks, "previous_check")
    timed(weights, "ov_scores")

    def run_stats() -> tuple[float, float]:
        t, c = time.perf_counter(), time.process_time()
        activation_stats(lm, texts, batch_size=8)
        return time.perf_counter() - t, time.process_time() - c

    def run_heads() -> tuple[float, float, object]:
        t, c = time.perf_counter(), time.process_time()
        r = core.heads(lm, texts, subjects=subjects, induction=8, induction_length=64)
        return time.perf_counter() - t, time.process_time() - c, r

    run_stats()  # warm-up
    st, hd, st_cpu, hd_cpu = [], [], [], []
    result = None
    for _ in range(args.repeats):
        for x, list_ in zip(run_stats(), (st, st_cpu), strict=True):
            list_.append(x)
        phases.clear()
        cpu_phases.clear()
        t, c, result = run_heads()
        hd.append(t)
        hd_cpu.append(c)
        for x, list_ in zip(run_stats(), (st, st_cpu), strict=True):
            list_.append(x)
    s, h = statistics.median(st), statistics.median(hd)
    candidates = {"induction": sum(x.loss_change is not None for x in result.heads),
                  "previous-token": sum(x.next_share is not None for x in result.heads)}
    out = {"prompts": len(texts), "prompt_tokens": tokens, "threads": torch.get_num_threads(),
           "stats_s": st, "heads_s": hd, "ratio": h / s, "heads_phases_s": phases,
           "stats_cpu_s": st_cpu, "heads_cpu_s": hd_cpu,
           "cpu_ratio": statistics.median(hd_cpu) / statistics.median(st_cpu),
           "heads_phases_cpu_s": cpu_phases, "checked_heads": candidates,
           "load_average": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
