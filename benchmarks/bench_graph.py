"""`fptrace graph --neurons` on the bundled model: time and peak RSS of one graph.

    python benchmarks/bench_graph.py [--tokens 16] [--max-nodes 64] [--per-site 4] [--repeat 3]

Method: one fresh process; the bundled model (SmolLM2-135M-Instruct, float32, CPU) is loaded,
then a prompt of exactly --tokens tokens (a fixed English sentence's ids, cut or repeated) is
graphed --repeat times with the defaults of `fptrace graph` (the first run is the warm-up and
is reported apart); the median wall time of the others, the peak RSS of the process (VmHWM,
model included) and the check's residuals are printed as one JSON line (results-graph.json).
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--max-nodes", type=int, default=64)
    ap.add_argument("--per-site", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from fptrace.commands.graph.core import graph
    from fptrace.models.loading import load_model

    lm = load_model()
    ids = list(lm.prepare(TEXT).ids)
    ids = (ids * (args.tokens // len(ids) + 1))[:args.tokens]
    after_load = peak_rss_mib()
    times, g = [], None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        g = graph(lm, ids, max_nodes=args.max_nodes, per_site=args.per_site)
        times.append(time.perf_counter() - t0)
    assert g is not None
    print(json.dumps({
        "tokens": args.tokens, "max_nodes": args.max_nodes, "per_site": args.per_site,
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or None,
        "first_s": round(times[0], 2),
        "median_s": round(statistics.median(times[1:] or times), 2),
        "peak_rss_mib": round(peak_rss_mib(), 1), "rss_after_load_mib": round(after_load, 1),
        "computed": g.computed, "kept_nodes": len(g.nodes), "kept_edges": len(g.edges),
        "graph_sums": g.checks[0].value, "graph_model": g.checks[1].value, "ok": g.ok,
        "replacement_nodes": round(g.scores.replacement_nodes, 4),
        "completeness_nodes": round(g.scores.completeness_nodes, 4)}))


if __name__ == "__main__":
    main()
