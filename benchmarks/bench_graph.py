"""`fptrace graph` on the bundled model: time and peak RSS of one graph, against the estimate.

    python benchmarks/bench_graph.py [--tokens 16] [--max-nodes 64] [--per-site 4] [--repeat 3]
        [--latents N [--active 12] [--all-active]] [--phases]
    MALLOC_MMAP_THRESHOLD_=131072 python benchmarks/bench_graph.py --pass-memory 64 128 256

Method: one fresh process; the bundled model (SmolLM2-135M-Instruct, float32, CPU) is loaded,
then a prompt of exactly --tokens tokens (a fixed English sentence's ids, cut or repeated) is
graphed --repeat times with the defaults of `fptrace graph` (the first run is the warm-up and
is reported apart); the median wall time of the others, the peak RSS of the process (VmHWM,
model included) and the check's residuals are printed as one JSON line (results-graph.json).

By default the graph is of the model's neurons (`--neurons`). With --latents N it is of 30
seeded random JumpReLU transcoders of N latents (one per block), built here on the prompt as
bench_circuit_tracer.py builds them (--active latents firing per (block, position) on average,
decoders 0.8 × the least-squares fit of the MLP's output); with --all-active, every latent that
fires is a candidate and gets its row (per_site the most at one site, max_nodes all of them:
the setting of the comparison with circuit-tracer). The JSON also gives the estimate of
fptrace/commands/graph/core.py (`graph_bytes`: what the graph holds at its peak, from the
shapes) beside the peak RSS above what was resident before the call (VmHWM reset just
before each graph). With --phases, a thread samples VmRSS every 5 ms and the JSON gives, per
phase of the graph (the real pass, each frozen pass, the backward passes' rows, the
assembly and pruning, the split over heads and its vectors), the most resident while it ran,
what was resident after it, and the process's CPU time spent inside it (phases nested in it
included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TEXT = ("The capital of France is Paris, and the capital of Germany is Berlin; the capital of "
        "Italy is Rome, and the capital of Spain is")


def peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> float:
    """The resident set now (MiB), the peak (VmHWM) reset to it (/proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_mib()


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Phases:
    """Per phase (the innermost wrapped function running), the most resident while it ran
    (sampled every 5 ms) and what was resident after its last call (MiB)."""

    WRAPPED = (("core", "real_pass"), ("core", "rows"), ("core", "_assemble"),
               ("core", "split_edges"), ("core", "vectors"), ("core", "split"),
               ("core", "head_scores"), ("passes", "frozen"), ("verify", "verify"))

    def __init__(self) -> None:
        import threading

        self.stack: list[str] = ["graph"]
        self.peak: dict[str, float] = {}
        self.after: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.cpu: dict[str, float] = {}  # the process's CPU time inside each (nested ones included)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            name, rss = self.stack[-1], rss_mib()
            self.peak[name] = max(self.peak.get(name, 0.0), rss)

    def wrap(self, module, name: str) -> None:
        fn = getattr(module, name)

        def wrapped(*a, **kw):
            label = f"{module.__name__.rsplit('.', 1)[-1]}.{name}"
            self.stack.append(label)
            t0 = time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                self.stack.pop()
                self.cpu[label] = self.cpu.get(label, 0.0) + time.process_time() - t0
                self.after[label] = round(rss_mib(), 1)
                self.calls[label] = self.calls.get(label, 0) + 1

        setattr(module, name, wrapped)

    def start(self) -> None:
        import fptrace.commands.graph.core as core
        import fptrace.commands.graph.passes as passes
        import fptrace.commands.graph.verify as verify

        mods = {"core": core, "passes": passes, "verify": verify}
        for mod, name in self.WRAPPED:
            self.wrap(mods[mod], name)
        self._thread.start()

    def report(self) -> dict:
        self._stop.set()
        return {k: {"peak_mib": round(v, 1), "after_mib": self.after.get(k),
                    "calls": self.calls.get(k), "cpu_s": round(self.cpu.get(k, 0.0), 2)}
                for k, v in self.peak.items()}


def pass_memory(lengths: list[int]) -> list[dict]:
    """--pass-memory: per length T, one frozen pass of T seeded random tokens alone (resident
    memory before and after it, freed before the next), then one batch of rows_fitting's
    targets (one neuron of the last block at the last positions: the most a target's backward
    pass holds) with VmHWM reset just before; beside core.py's counts (pass_bytes, and
    backward_bytes × the batch). Run it with MALLOC_MMAP_THRESHOLD_=131072, or a pass measured
    after another reuses the other's freed memory."""
    import gc
    import random

    from fptrace.commands.graph import core
    from fptrace.commands.graph.freezing import mlp_sites
    from fptrace.commands.graph.model64 import float64_copy, real_pass
    from fptrace.commands.graph.passes import FrozenPasses
    from fptrace.commands.graph.rows import Candidates, Target, rows
    from fptrace.core.trace import model_info
    from fptrace.models.loading import load_model

    lm = load_model()
    model, parts = float64_copy(lm)
    sites = mlp_sites(lm.parts.family)
    info = model_info(lm)
    L, d, nh = info.n_layers, info.d_model, info.n_heads
    rng = random.Random(0)
    ids = [rng.randrange(1000, 20000) for _ in range(max(lengths))]
    out = []
    for T in lengths:
        real = real_pass(lm, model, parts, sites, ids[:T], [T - 1], None)
        m = int(real.acts.shape[-1])
        gc.collect()
        before = rss_mib()
        p = FrozenPasses(model, parts, sites, None, ids[:T], [T - 1])(T)
        gc.collect()
        held = rss_mib() - before
        cand = Candidates.top(real.acts, 4)
        last = next(c for c in range(len(cand)) if cand.layer[c] == L - 1)
        batch = core.rows_fitting(T, L, m, d, core.BATCH)
        targets = [Target(L - 1, T - 1 - j, int(cand.index[last])) for j in range(batch)]
        base = reset_peak()
        got = rows(p, targets, cand)
        backward = peak_rss_mib() - base
        out.append({"tokens": T, "pass_mib": round(held, 1),
                    "pass_values_a_block_position": round(held * 2**20 / 8 / T / L),
                    "pass_bytes_mib": round(core.pass_bytes(T, L, m, d, nh) / 2**20, 1),
                    "batch": batch, "backward_mib": round(backward, 1),
                    "backward_estimate_mib": round(
                        batch * core.backward_bytes(T, L, m, d) / 2**20, 1)})
        print(json.dumps(out[-1]), flush=True)
        del got, p, real
        gc.collect()
    return out


def random_transcoders(lm, ids: list[int], latents: int, active: int, fit: float):
    """bench_circuit_tracer.py's seeded random JumpReLU transcoders on this prompt, read: the
    TranscoderSet and the number of latents that fire at each (block, position)."""
    import tempfile

    from bench_circuit_tracer import mlp_inputs, write_transcoders

    from fptrace.commands.graph.transcoders import read_transcoders

    x, y, _ = mlp_inputs(lm, ids)
    root = tempfile.mkdtemp(prefix="fptrace-bench-graph-")
    tc = write_transcoders(x, y, latents, active, fit, root, hf="")
    return read_transcoders(tc["saelens"], lm), tc["counts"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--max-nodes", type=int, default=64)
    ap.add_argument("--per-site", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--latents", type=int, default=0,
                    help="random transcoders of this many latents (0: the model's neurons)")
    ap.add_argument("--active", type=int, default=12)
    ap.add_argument("--all-active", action="store_true")
    ap.add_argument("--phases", action="store_true")
    ap.add_argument("--pass-memory", type=int, nargs="+", metavar="T",
                    help="measure one frozen pass and one batch's backward pass alone at each "
                         "length, beside core.py's counts (pass_memory)")
    args = ap.parse_args()
    if args.pass_memory:
        pass_memory(args.pass_memory)
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fptrace.commands.graph import core
    from fptrace.models.loading import load_model

    lm = load_model()
    ids = list(lm.prepare(TEXT).ids)
    ids = (ids * (args.tokens // len(ids) + 1))[:args.tokens]
    tset, counts = None, None
    max_nodes, per_site = args.max_nodes, args.per_site
    if args.latents:
        tset, counts = random_transcoders(lm, ids, args.latents, args.active, 0.8)
        if args.all_active:
            per_site, max_nodes = int(counts.max()), int(counts.sum())
    after_load = peak_rss_mib()
    phases = Phases() if args.phases else None
    if phases:
        phases.start()
    times, g, above = [], None, []
    for _ in range(args.repeat):
        before = reset_peak()
        t0 = time.perf_counter()
        g = core.graph(lm, ids, max_nodes=max_nodes, per_site=per_site, transcoders=tset)
        times.append(time.perf_counter() - t0)
        above.append(round(peak_rss_mib() - before, 1))
    assert g is not None
    estimate = core.graph_bytes(lm, g, transcoders=tset)
    print(json.dumps({
        "tokens": args.tokens, "max_nodes": max_nodes, "per_site": per_site,
        "latents": args.latents or None,
        "active": None if counts is None else int(counts.sum()),
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or None,
        "first_s": round(times[0], 2),
        "median_s": round(statistics.median(times[1:] or times), 2),
        "peak_rss_mib": round(peak_rss_mib(), 1), "rss_after_load_mib": round(after_load, 1),
        "peak_above_before_mib": above,
        "estimate_mib": {k: round(v / 2**20, 1) for k, v in estimate.items()},
        "phases": phases.report() if phases else None,
        "computed": g.computed, "kept_nodes": len(g.nodes), "kept_edges": len(g.edges),
        "graph_sums": g.checks[0].value, "graph_model": g.checks[1].value, "ok": g.ok,
        "replacement_nodes": round(g.scores.replacement_nodes, 4),
        "completeness_nodes": round(g.scores.completeness_nodes, 4)}))


if __name__ == "__main__":
    main()
