"""Benchmark and measurements of `--engine llama.cpp` on the bundled model (SmolLM2-135M Q4_1).

Method (figures in benchmarks/README.md and docs/llamacpp.md):
- capture cost: in one process, llama.cpp's pass over a prompt of T tokens without the eval
  callback, with it copying the mapped points (what fptrace uses), and with it copying every
  graph tensor, alternate `--pairs` times after a warm-up; the time is llama_decode's wall time
  (the model load is outside it); medians and ratios against the uncaptured pass;
- `fptrace run --engine llama.cpp` against `fptrace run` on the same GGUF: wall time of the
  whole command in fresh processes (warm cache), median of `--runs`;
- accuracy: llama.cpp's token ids against transformers' for the README's prompts; per block,
  the relative difference of the last position's stream (llama.cpp against transformers'
  dequantized float32 forward) with flash attention on and off, llama.cpp on against off, and
  the first point where `diff --deep` sees the two engines part.

Usage: python benchmarks/bench_llamacpp.py [--lengths 5 128 512] [--pairs 7] [--runs 3]
       [--json results-llamacpp.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
README_PROMPTS = ("The capital of France is", "What is the capital of France?")


def gguf() -> str:
    from fptrace.models.registry import known_models

    return known_models()["smollm2-135m"].gguf_path()


def capture_cost(lengths, pairs, threads) -> list[dict]:
    from fptrace.engines.llamacpp.capture import EngineOptions, run_pass
    from fptrace.engines.llamacpp.trace import wanted_names

    options = EngineOptions(threads=threads)

    path, rows = gguf(), []
    for T in lengths:
        ids = [(7 * i + 11) % 49000 + 100 for i in range(T)]
        modes = {"bare": dict(capture=False), "mapped": dict(wanted=wanted_names()),
                 "all": dict(wanted=None)}
        for kw in modes.values():  # warm-up
            run_pass(path, "", options, ids=ids, **kw)
        times: dict = {m: [] for m in modes}
        for _ in range(pairs):
            for m, kw in modes.items():
                times[m].append(run_pass(path, "", options, ids=ids, **kw).decode_seconds)
        med = {m: statistics.median(v) for m, v in times.items()}
        rows.append(dict(T=T, bare_ms=med["bare"] * 1e3, mapped_ms=med["mapped"] * 1e3,
                         all_ms=med["all"] * 1e3, mapped_ratio=med["mapped"] / med["bare"],
                         all_ratio=med["all"] / med["bare"]))
        print(rows[-1], file=sys.stderr)
    return rows


def command_times(runs) -> dict:
    prompt = README_PROMPTS[0]
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = {}
    for name, extra in (("transformers", []), ("llama.cpp", ["--engine", "llama.cpp"])):
        walls = []
        for _ in range(runs + 1):  # the first run warms the cache and is dropped
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "fptrace", "run", prompt, "--json", *extra],
                           check=True, capture_output=True, env=env)
            walls.append(time.perf_counter() - start)
        out[name] = statistics.median(walls[1:])
    print(out, file=sys.stderr)
    return out


def accuracy() -> dict:
    import numpy as np
    import torch

    from fptrace.commands.diff.engine import engine_diff
    from fptrace.engines import engine
    from fptrace.engines.llamacpp.capture import EngineOptions, run_pass
    from fptrace.models.loading import load_model

    path = gguf()
    lm = load_model("smollm2-135m", device="cpu")
    out: dict = {"ids_equal": {p: list(run_pass(path, p, capture=False).ids) == lm.encode(p)
                               for p in README_PROMPTS}}
    prompt = README_PROMPTS[0]
    ids = lm.encode(prompt)
    with torch.inference_mode():
        hs = lm.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    passes = {fa: run_pass(path, prompt, EngineOptions(flash_attn=fa), ids=ids)
              for fa in ("on", "off")}

    def rel(a, b):
        return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(a))

    for fa, p in passes.items():
        out[f"block_rel_flash_{fa}"] = [
            rel(hs[k + 1][0, -1].numpy(), p.tensors[f"l_out-{k}"].reshape(len(ids), -1)[-1])
            for k in range(p.n_layer - 1)]
        logp = torch.log_softmax(torch.from_numpy(p.logits[-1]), -1)
        ref = torch.log_softmax(lm.model(torch.tensor([ids])).logits[0, -1].detach(), -1)
        out[f"kl_flash_{fa}"] = float((ref.exp() * (ref - logp)).sum())
        out[f"top5_same_flash_{fa}"] = ref.topk(5).indices.tolist() == logp.topk(5).indices.tolist()
    out["on_vs_off"] = [rel(passes["off"].tensors[f"l_out-{k}"].reshape(len(ids), -1)[-1],
                            passes["on"].tensors[f"l_out-{k}"].reshape(len(ids), -1)[-1])
                        for k in range(passes["on"].n_layer)]
    for fa in ("on", "off"):
        d = engine_diff(lm, engine("llama.cpp"), path, prompt, settings={"flash_attn": fa},
                        deep=True)
        out[f"parted_flash_{fa}"] = d.deep.parted.sentence if d.deep.parted else None
        out[f"block0_points_flash_{fa}"] = {p.point: p.rel for p in d.deep.blocks[0].points}
    print(json.dumps(out, indent=1), file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[5, 128, 512])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="llama.cpp's threads for the capture timing (1: its OpenMP threads "
                    "spin-wait, which a shared machine turns into noise)")
    ap.add_argument("--json", default=os.path.join(HERE, "results-llamacpp.json"))
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    result = dict(date=time.strftime("%Y-%m-%d"), threads=args.threads,
                  capture=capture_cost(args.lengths, args.pairs, args.threads),
                  commands=command_times(args.runs), accuracy=accuracy())
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
