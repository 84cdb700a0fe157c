"""The gap between llama.cpp and transformers on each mapped architecture (docs/llamacpp.md).

Method: for each family whose llama.cpp names are mapped, the tiny GGUF of
tests/test_llamacpp_families.py (tests/tiny_gguf.py: a tiny random model of the family, float32
tensors under llama.cpp's names, the bundled model's tokenizer) is loaded in transformers and run
in llama.cpp through the engine (`engine_diff`, as `diff --engine-b llama.cpp --deep` does), on
the README's prompt, under two settings: llama.cpp's defaults (flash attention auto, i.e. on,
and the K/V cache in f16) and float32 end to end (flash attention off, K/V cache f32). Reported
per family and setting: the largest relative difference of the last position's stream over the
blocks, and the largest of any point `--deep` compares (over every position) with its place.

The architectures fptrace reads itself (transformers' GGUF loader reads none of them: OLMo 2,
GPT-NeoX, OLMoE, gpt-oss, the same table's last rows) are measured the same way, their file
loaded through fptrace's reader.
--only FAMILY ... measures those families alone and, with --json, replaces their rows of the
results file, keeping the others'.

Usage: python benchmarks/bench_llamacpp_families.py [--json results-llamacpp-families.json]
       [--only FAMILY ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # this checkout's fptrace and tests

PROMPT = "The capital of France is"
SETTINGS = {"defaults": {}, "float32": {"flash_attn": "off", "kv_cache": "f32"}}


def measure(family: str, arch: str, adjacent: bool, folder: str) -> dict:
    from test_llamacpp_families import MODEL, NORM_OFFSET, tiny_model
    from tiny_gguf import write

    from fptrace.commands.diff.engine import engine_diff
    from fptrace.engines import engine
    from fptrace.models.loading import load_model
    from fptrace.models.registry import known_models

    bundled = known_models()["smollm2-135m"].gguf_path()
    path = os.path.join(folder, f"tiny-{family}.gguf")
    write(tiny_model(family, **MODEL.get(family, {})), path, arch, bundled, rope_adjacent=adjacent,
          norm_offset=NORM_OFFSET.get(family, 0.0))
    lm = load_model(path, device="cpu")
    out = {"family": family, "arch": arch}
    for label, settings in SETTINGS.items():
        d = engine_diff(lm, engine("llama.cpp"), path, PROMPT, settings=settings, deep=True)
        blocks = [r.rel_diff for r in d.layers if r.layer is not None]
        points = [(p.rel, b.layer, p.point) for b in d.deep.blocks for p in b.points
                  if p.rel is not None]
        worst = max(points)
        out[label] = {"stream_worst": max(blocks), "point_worst": worst[0],
                      "point_at": f"block {worst[1]} {worst[2]}"}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    os.environ.setdefault("FPTRACE_CACHE_DIR", tempfile.mkdtemp(prefix="fptrace-bench-"))
    from test_llamacpp_families import ARCHS

    every = [(f, a, adjacent) for f, a, adjacent, *_ in ARCHS]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for family, arch, adjacent in every:
            if args.only is not None and family not in args.only:
                continue
            rows.append(measure(family, arch, adjacent, folder))
            print(json.dumps(rows[-1]), file=sys.stderr)
    if args.json:
        out = os.path.join(HERE, args.json)
        if args.only is not None and os.path.exists(out):
            with open(out, encoding="utf-8") as f:
                kept = [r for r in json.load(f) if r["family"] not in args.only]
            order = [f for f, *_ in every]
            rows = sorted(kept + rows, key=lambda r: order.index(r["family"])
                          if r["family"] in order else len(order))
        with open(out, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
