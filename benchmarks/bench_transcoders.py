"""The goal of `fptrace features train --transcoder` (issue 43): transcoders for every block of
the bundled model, >= 2,048 latents each, trained in <= 60 minutes on 2 cores, with a median
held-out FVU of the MLP outputs <= 0.3.

    python benchmarks/bench_transcoders.py CORPUS... [--layers all] [--latents 2048] [--k 32]
        [--tokens 262144] [--lr 2e-3] [--threads 2] [--out DIR] [--export circuit-tracer] [--skip]
        [--json results-transcoders.json]

CORPUS: .txt (one prompt a line) / .jsonl files or folders, read as `fptrace features train`
reads them; or `--docstrings PACKAGES --corpus-out FILE [--paragraphs N]`, which first writes
an offline corpus of English prose (bench_features_train.py's `docstring_corpus`: the docstrings
of installed packages, one paragraph a line; N of them drawn with a fixed seed) and trains on it.
`train_transcoders` (the code of the command) runs with a progress callback that times the
collection pass and each block's training apart; the held-out FVU, L0 and dead latents are the
trainer's own result. With `--layers` a subset (e.g. 0,15,29), the total for every block is
extrapolated from the blocks trained: collection (measured, it reads the blocks given) + the
mean training time per block × the model's blocks. Method and figures: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    from bench_features_train import Phases, corpus_files, corpus_options

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    corpus_options(ap)
    ap.add_argument("--layers", default="all")
    ap.add_argument("--latents", type=int, default=2048)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=262_144)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--export", default=None)
    ap.add_argument("--skip", action="store_true", help="skip transcoders (features train "
                    "--transcoder --skip)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    a.corpus = corpus_files(a)

    import torch

    torch.set_num_threads(a.threads)
    from fptrace.addresses import parse_selection
    from fptrace.commands.features.train import TrainOptions
    from fptrace.commands.features.transcoders import train_transcoders
    from fptrace.models.loading import load_model

    lm = load_model(device="cpu")
    out = a.out or tempfile.mkdtemp(prefix="fptrace-bench-transcoders-")
    if os.path.isdir(out) and os.listdir(out):
        raise SystemExit(f"{out} is not empty")
    t0 = time.perf_counter()
    r = train_transcoders(lm, a.corpus, out,
                          TrainOptions(layer=0, latents=a.latents, k=a.k, tokens=a.tokens,
                                       batch_tokens=a.batch_tokens, lr=a.lr, skip=a.skip),
                          parse_selection(a.layers, "--layers"), export=a.export,
                          progress=Phases())
    total = time.perf_counter() - t0
    n_blocks = r.model.n_layers
    per_block = statistics.mean(x.seconds for x in r.layers)
    projected = r.collect_seconds + per_block * n_blocks
    figures = {
        "layers": [x.layer for x in r.layers], "latents": r.latents, "k": r.k,
        "threads": a.threads, "lr": a.lr, "skip": a.skip, "prompts": r.prompts,
        "held_out_prompts": r.held_out_prompts, "distinct_train_positions": r.train_tokens,
        "held_out_positions": r.held_out_tokens, "tokens_seen_per_block": r.tokens_seen,
        "steps_per_block": r.layers[0].steps,
        "per_layer": [{"layer": x.layer, "fvu": x.fvu, "l0": x.l0, "dead": x.dead_latents,
                       "first_loss": x.first_loss, "last_loss": x.last_loss,
                       "train_s": x.seconds, "export_fvu": x.export_fvu,
                       "export_l0": x.export_l0, "export_threshold": x.export_threshold}
                      for x in r.layers],
        "fvu_median": r.fvu_median, "fvu_max": max(x.fvu for x in r.layers),
        "l0_mean": statistics.mean(x.l0 for x in r.layers),
        "dead_total": sum(x.dead_latents for x in r.layers),
        "collect_s": r.collect_seconds, "train_s": r.seconds, "total_s": total,
        "train_s_per_block": per_block, "projected_all_blocks_s": projected,
        "cpu_s": (lambda u: u.ru_utime + u.ru_stime)(resource.getrusage(resource.RUSAGE_SELF)),
        "load_average_at_end": os.getloadavg(),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "goals": {"latents >= 2048": r.latents >= 2048,
                  "median FVU <= 0.3": r.fvu_median <= 0.3,
                  "<= 60 min (every block; projected when a subset was trained)":
                      projected <= 3600},
        "out": out,
    }
    print(json.dumps(figures, indent=2))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
