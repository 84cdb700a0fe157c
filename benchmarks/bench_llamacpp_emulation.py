"""How much of the gap between transformers and llama.cpp each of llama.cpp's numerics explains
(`diff --engine-b llama.cpp --emulate`), measured on a GGUF (the bundled SmolLM2 Q4_1 unless
--gguf names another) for the README's prompts, with flash attention on and off.

Method: for each prompt and flash-attention setting, llama.cpp's pass (1 thread) against
transformers' float32 pass over the same file with no step on, then each step of
engines/llamacpp/emulate.py added in turn (the ladder of `engine_diff`): per block, the relative
difference of the last position's stream, and the error each block adds alone (fed llama.cpp's
own input: its output of the block before, every position); then `diff --deep` with every step
on, for the operations that keep the rest: the first point that parts, and each block's largest
point.

A Q4_K_M file: `--q4-k-m FILE` writes one from the bundled model first (llama.cpp's Q4_K_M
type rule, ggml's quantizer: fptrace/engines/llamacpp/quantize.py), unless FILE exists, and
measures on it.

Other families: `--families` measures, instead of the bundled model, the tiny Q4_1 file of each
family whose weights map onto llama.cpp's names (Qwen2, Qwen3, Qwen3-MoE, Qwen2-MoE), as
tests/test_llamacpp_families.py writes it (a tiny random model of the family in float32 under
llama.cpp's names, then every 2-D tensor but the routers quantized to Q4_1 by ggml).

Usage: python benchmarks/bench_llamacpp_emulation.py [--gguf FILE | --q4-k-m FILE | --families]
       [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
README_PROMPTS = ("The capital of France is", "What is the capital of France?")


def measure(path: str, model: str) -> list[dict]:
    from fptrace.commands.diff.engine import engine_diff
    from fptrace.engines import engine
    from fptrace.engines.llamacpp.emulate import STEPS
    from fptrace.models.loading import load_model

    lm = load_model(model, device="cpu")
    out = []
    for prompt in README_PROMPTS:
        for fa in ("on", "off"):
            settings = {"flash_attn": fa, "threads": 1}
            start = time.perf_counter()
            d = engine_diff(lm, engine("llama.cpp"), path, prompt, settings=settings,
                            emulate=tuple(STEPS), deep=True)
            em = d.emulation
            blocks = {b.layer: b for b in d.deep.blocks}
            row = dict(
                prompt=prompt, flash_attn=fa, tokens=len(d.a.tokens),
                rungs=[dict(label=r.label, worst=r.worst, median=r.median,
                            per_block=list(r.rel[1:]), alone_worst=r.alone_worst,
                            alone_median=r.alone_median, alone=list(r.alone))
                       for r in em.rungs],
                fall_worst=em.fall, fall_alone_worst=em.fall_alone,
                fall_alone_median=em.rungs[0].alone_median / em.rungs[-1].alone_median
                if em.rungs[-1].alone_median else None,
                fall_median=em.rungs[0].median / em.rungs[-1].median
                if em.rungs[-1].median else None,
                exact_blocks=[k for k, x in enumerate(em.rungs[-1].rel[1:])
                              if x is not None and x < 1e-5],
                parted=d.deep.parted.sentence if d.deep.parted else None,
                worst_points={k: (b.worst, b.worst_rel) for k, b in blocks.items()},
                seconds=time.perf_counter() - start)
            out.append(row)
            print(json.dumps({k: v for k, v in row.items()
                              if k not in ("worst_points", "rungs")}), file=sys.stderr)
            for r in row["rungs"]:
                print(f"  {r['label']:8s} largest {r['worst']:.2e} median {r['median']:.2e}"
                      f"  alone: largest {r['alone_worst']:.2e} median {r['alone_median']:.2e}",
                      file=sys.stderr)
    return out


def families() -> list[dict]:
    """The ladder on each family's tiny Q4_1 file (tests/test_llamacpp_families.py's)."""
    import tempfile

    import gguf as G
    from test_llamacpp_families import ARCHS, EMULATED, tiny_model
    from tiny_gguf import write

    from fptrace.engines.llamacpp.quantize import one_type, requantize
    from fptrace.models.registry import known_models

    bundled = known_models()["smollm2-135m"].gguf_path()
    out = []
    with tempfile.TemporaryDirectory() as folder:
        for family in EMULATED:
            _, arch, adjacent, *_ = next(a for a in ARCHS if a[0] == family)
            f32 = os.path.join(folder, f"{family}-f32.gguf")
            q41 = os.path.join(folder, f"{family}-q4_1.gguf")
            write(tiny_model(family, **EMULATED[family]), f32, arch, bundled,
                  rope_adjacent=adjacent)
            requantize(f32, q41, one_type("Q4_1"), G.LlamaFileType.MOSTLY_Q4_1, "Q4_1")
            print(family, file=sys.stderr)
            out.append(dict(family=family, runs=measure(q41, q41)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=None, help="a GGUF file (default: the bundled model's)")
    ap.add_argument("--q4-k-m", default=None,
                    help="write the bundled model as Q4_K_M to this file (unless it exists) "
                    "and measure on it")
    ap.add_argument("--json", default=os.path.join(HERE, "results-llamacpp-emulation.json"))
    ap.add_argument("--families", action="store_true",
                    help="measure each mapped family's tiny Q4_1 file instead")
    args = ap.parse_args()
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # this checkout's fptrace and tests
    if args.families:
        if args.json == ap.get_default("json"):
            args.json = os.path.join(HERE, "results-llamacpp-emulation-families.json")
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(dict(date=time.strftime("%Y-%m-%d"), gguf="tiny Q4_1 per family",
                           families=families()), f, indent=1)
        return
    from fptrace.models.registry import known_models

    bundled = known_models()["smollm2-135m"].gguf_path()
    if args.q4_k_m:
        from fptrace.engines.llamacpp.quantize import write_q4_k_m

        if not os.path.exists(args.q4_k_m):
            write_q4_k_m(bundled, args.q4_k_m)
        args.gguf = args.q4_k_m
    path = args.gguf or bundled
    model = args.gguf or "smollm2-135m"
    result = dict(date=time.strftime("%Y-%m-%d"), gguf=os.path.basename(path),
                  runs=measure(path, model))
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
