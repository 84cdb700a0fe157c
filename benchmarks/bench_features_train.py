"""The full-size goal of `fptrace features train` (issue 35): a TopK SAE on the bundled model's
block-15 stream, >= 2,048 latents, >= 200k training tokens, FVU <= 0.3 on held-out text, in <= 30
minutes on 2 cores.

    python benchmarks/bench_features_train.py CORPUS... [--layer 15] [--latents 2048] [--k 32]
        [--tokens 200000] [--threads 2] [--out DIR] [--json results-features-train.json]

CORPUS: .txt (one prompt a line) / .jsonl files or folders, read as `fptrace features train`
reads them (each prompt's first position left out; a tenth of the prompts held out). The script
times the collection of the stream and the training separately, then reports the held-out FVU,
L0 and dead latents from the trainer's result, the distinct training positions (not only the
tokens the optimiser saw), and whether each goal is met. Method and figures: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", nargs="+")
    ap.add_argument("--layer", type=int, default=15)
    ap.add_argument("--latents", type=int, default=2048)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    from fptrace.commands.features.train import TrainOptions, train
    from fptrace.models.loading import load_model

    lm = load_model(device="cpu")
    out = a.out or tempfile.mkdtemp(prefix="fptrace-bench-sae-")
    if os.path.isdir(out) and os.listdir(out):
        raise SystemExit(f"{out} is not empty")
    phases: dict[str, float] = {}
    last = {"phase": None, "t": time.perf_counter()}

    def progress(phase: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if last["phase"] != phase:
            if last["phase"] is not None:
                phases[last["phase"]] = now - last["t"]
            last.update(phase=phase, t=now)
        if phase == "steps" and done % 20 == 0:
            print(f"step {done}/{total}", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    r = train(lm, a.corpus, out, TrainOptions(layer=a.layer, latents=a.latents, k=a.k,
                                              tokens=a.tokens, batch_tokens=a.batch_tokens),
              progress=progress)
    total = time.perf_counter() - t0
    phases[last["phase"]] = time.perf_counter() - last["t"]
    figures = {
        "layer": r.layer, "latents": r.latents, "k": r.k, "threads": a.threads,
        "prompts": r.prompts, "held_out_prompts": r.held_out_prompts,
        "distinct_train_positions": r.train_tokens, "held_out_positions": r.held_out_tokens,
        "tokens_seen": r.tokens_seen, "steps": r.steps, "fvu_held_out": r.fvu, "l0": r.l0,
        "dead_latents": r.dead_latents, "first_loss": r.first_loss, "last_loss": r.last_loss,
        "collect_s": phases.get("prompts"), "train_s": phases.get("steps"), "total_s": total,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "goals": {"latents >= 2048": r.latents >= 2048,
                  "distinct tokens >= 200k": r.train_tokens >= 200_000,
                  "FVU <= 0.3": r.fvu <= 0.3, "<= 30 min": total <= 1800},
        "out": out,
    }
    print(json.dumps(figures, indent=2))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
