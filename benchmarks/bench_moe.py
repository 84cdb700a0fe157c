"""Benchmark of routing capture on a mixture-of-experts model (a random-weight Mixtral config:
8 experts, 2 per token, d_model 512, 8 blocks, d_expert 1024, vocab 8000; float32, CPU).

Method (see benchmarks/README.md for the figures):
- One process; the model is built once from the config (random weights: the cost of a pass
  does not depend on the values).
- At each prompt length T, after warm-up, three calls are run in turn, `--pairs` rounds:
  the bare forward `model(input_ids, logits_to_keep=1, use_cache=False)`; the same forward with
  routing captured (core/routing.py's hooks on every router, then routing_of_rows: the chosen
  experts, weights, mass and entropy of every block and position, and the check that
  recomputes the family's rule); and the whole `run_trace(..., logit_lens=False)` (the per-layer
  statistics and the routing). Medians, and their ratios to the bare forward. Beside them, the
  routing's work after the forward alone (routing_of_rows on one pass's capture), as a share of
  the bare forward: a figure a busy machine disturbs less than the end-to-end ratio.

Usage: python benchmarks/bench_moe.py [--lengths 16 128 512] [--pairs 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def build():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from fptrace.models.loading import wrap_model

    config = AutoConfig.for_model(
        "mixtral", num_hidden_layers=8, hidden_size=512, intermediate_size=1024,
        num_attention_heads=8, num_key_value_heads=8, vocab_size=8000,
        max_position_embeddings=2048, num_local_experts=8, num_experts_per_tok=2,
        sliding_window=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    return wrap_model(model, name="bench-mixtral", random_weights=True)


def modes(lm, T: int) -> dict:
    import torch

    from fptrace.core.routing import capture_routing, moe_facts, routing_of_rows
    from fptrace.core.trace import run_trace

    g = torch.Generator().manual_seed(T)
    ids = torch.randint(10, lm.config.vocab_size, (1, T), generator=g)
    ids_list = ids[0].tolist()
    model, moe = lm.model, moe_facts(lm.parts, lm.config)

    def bare():
        with torch.inference_mode():
            model(ids, logits_to_keep=1, use_cache=False)

    def routing():
        with torch.inference_mode(), capture_routing(lm.parts, lm.config) as cap:
            model(ids, logits_to_keep=1, use_cache=False)
        rows = routing_of_rows(cap, moe, 1, T, [T], "float32")
        assert rows[0].checked

    def traced():
        run_trace(lm, ids_list, logit_lens=False)

    with torch.inference_mode(), capture_routing(lm.parts, lm.config) as kept:
        model(ids, logits_to_keep=1, use_cache=False)

    def after():  # the routing's work after the forward alone (less exposed to a busy machine)
        routing_of_rows(kept, moe, 1, T, [T], "float32")

    return {"bare": bare, "routing": routing, "run_trace": traced, "after_forward": after}


def measure(lm, T: int, pairs: int) -> dict:
    fns = modes(lm, T)
    for fn in fns.values():  # warm-up
        fn(), fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(pairs):
        for name, fn in fns.items():  # alternating, so drift hits every mode alike
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"T": T, "median_s": med,
            "routing_ratio": med["routing"] / med["bare"],
            "run_trace_ratio": med["run_trace"] / med["bare"],
            "after_forward_share": med["after_forward"] / med["bare"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[16, 128, 512])
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    lm = build()
    out = {"torch_threads": torch.get_num_threads(), "results": []}
    for T in args.lengths:
        r = measure(lm, T, args.pairs)
        out["results"].append(r)
        m = r["median_s"]
        print(f"T={T:5d}  bare {m['bare'] * 1e3:8.2f} ms   routing {m['routing'] * 1e3:8.2f} ms "
              f"({r['routing_ratio']:.3f}x)   run_trace {m['run_trace'] * 1e3:8.2f} ms "
              f"({r['run_trace_ratio']:.3f}x)   after the forward {m['after_forward'] * 1e3:.2f} ms "
              f"({100 * r['after_forward_share']:.1f}%)", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
