"""The full-size goal of `fptrace features train` (issue 35): a TopK SAE on the bundled model's
block-15 stream, >= 2,048 latents, >= 200k training tokens, FVU <= 0.3 on held-out text, in <= 30
minutes on 2 cores.

    python benchmarks/bench_features_train.py CORPUS... [--layer 15] [--latents 2048] [--k 32]
        [--tokens 200000] [--threads 2] [--out DIR] [--json results-features-train.json]

CORPUS: .txt (one prompt a line) / .jsonl files or folders, read as `fptrace features train`
reads them; or `--docstrings PACKAGE --corpus-out FILE`, which first writes an offline corpus of
English prose (the docstrings of an installed package's modules, one paragraph a line; e.g.
transformers, Apache-2.0) and trains on it (each prompt's first position left out; a tenth of the prompts held out). The script
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


def corpus_options(ap: argparse.ArgumentParser) -> None:
    """The corpus's options, shared with bench_transcoders.py."""
    ap.add_argument("corpus", nargs="*")
    ap.add_argument("--docstrings", help="build the corpus from these installed packages "
                    "(comma-separated)")
    ap.add_argument("--corpus-out", help="where --docstrings writes its corpus (a .txt)")
    ap.add_argument("--paragraphs", type=int, default=None,
                    help="with --docstrings: keep this many paragraphs, drawn with seed 0")


def corpus_files(a: argparse.Namespace) -> list[str]:
    """The files to train on: CORPUS, and the --docstrings corpus written first."""
    import random

    files = list(a.corpus)
    if a.docstrings:
        if not a.corpus_out:
            raise SystemExit("--docstrings needs --corpus-out FILE")
        lines = [x for p in a.docstrings.split(",") for x in docstring_corpus(p.strip())]
        if a.paragraphs is not None and a.paragraphs < len(lines):
            keep = sorted(random.Random(0).sample(range(len(lines)), a.paragraphs))
            lines = [lines[i] for i in keep]
        with open(a.corpus_out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {len(lines):,} paragraphs to {a.corpus_out}", file=sys.stderr)
        files.append(a.corpus_out)
    if not files:
        raise SystemExit("give CORPUS files or --docstrings PACKAGES")
    return files


class Phases:
    """A progress callback that times each phase of a training (from its first report to the
    next phase's), optionally printing a line every `every` steps."""

    def __init__(self, every: int | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.phase: str | None = None
        self.t = time.perf_counter()
        self.every = every

    def __call__(self, phase: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if self.phase != phase:
            self.close(now)
            self.phase, self.t = phase, now
            print(f"{phase} ...", file=sys.stderr, flush=True)
        if self.every and phase != "prompts" and done % self.every == 0:
            print(f"{phase} {done}/{total}", file=sys.stderr, flush=True)

    def close(self, now: float | None = None) -> None:
        if self.phase is not None:
            self.seconds[self.phase] = (now or time.perf_counter()) - self.t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    corpus_options(ap)
    ap.add_argument("--layer", type=int, default=15)
    ap.add_argument("--latents", type=int, default=2048)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    a.corpus = corpus_files(a)

    import torch

    torch.set_num_threads(a.threads)
    from fptrace.commands.features.train import TrainOptions, train
    from fptrace.models.loading import load_model

    lm = load_model(device="cpu")
    out = a.out or tempfile.mkdtemp(prefix="fptrace-bench-sae-")
    if os.path.isdir(out) and os.listdir(out):
        raise SystemExit(f"{out} is not empty")
    phases = Phases(every=20)
    t0 = time.perf_counter()
    r = train(lm, a.corpus, out, TrainOptions(layer=a.layer, latents=a.latents, k=a.k,
                                              tokens=a.tokens, batch_tokens=a.batch_tokens),
              progress=phases)
    total = time.perf_counter() - t0
    phases.close()
    figures = {
        "layer": r.layer, "latents": r.latents, "k": r.k, "threads": a.threads,
        "prompts": r.prompts, "held_out_prompts": r.held_out_prompts,
        "distinct_train_positions": r.train_tokens, "held_out_positions": r.held_out_tokens,
        "tokens_seen": r.tokens_seen, "steps": r.steps, "fvu_held_out": r.fvu, "l0": r.l0,
        "dead_latents": r.dead_latents, "first_loss": r.first_loss, "last_loss": r.last_loss,
        "collect_s": phases.seconds.get("prompts"), "train_s": phases.seconds.get("steps"),
        "total_s": total,
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


def docstring_corpus(package: str, shortest: int = 200, longest: int = 700) -> list[str]:
    """Paragraphs of prose from the docstrings of an installed package's modules, classes and
    functions (argument lists, examples and code left out), each once, in file order."""
    import ast
    import importlib.util
    import pathlib
    import re

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{package} is not an installed package")
    root = pathlib.Path(next(iter(spec.submodule_search_locations)))
    code = re.compile(r"(>>>|```|::|\bArgs:|\bReturns:|\bExample|\bParameters\b|==|\{|\}|\w\.\w+\(|https?:)")
    seen: set[str] = set()
    out = []
    for path in sorted(root.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node) or ""
            for para in re.split(r"\n\s*\n", doc):
                text = " ".join(para.split())
                if shortest <= len(text) <= longest and not code.search(text) \
                        and text not in seen:
                    seen.add(text)
                    out.append(text)
    return out


if __name__ == "__main__":
    main()
