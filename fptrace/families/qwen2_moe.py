"""Qwen2-MoE: Qwen2's block (biases on Q, K, V) with a sparse mixture of experts of
moe_intermediate_size each plus one shared expert (a SwiGLU MLP of
shared_expert_intermediate_size) that every token takes, its output scaled by
σ(shared_expert_gate · x), a gate of its own."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fptrace.families import Moe
from fptrace.families.mixtral import FAMILY as MIXTRAL
from fptrace.families.qwen3_moe import d_expert


def moe(cfg: Any) -> Moe | None:
    n = getattr(cfg, "num_experts", 0)
    if not n:
        return None
    return Moe(n_experts=int(n), top_k=int(cfg.num_experts_per_tok),
               d_expert=int(cfg.moe_intermediate_size),
               renormalise=bool(getattr(cfg, "norm_topk_prob", False)), n_shared=1,
               d_shared=int(cfg.shared_expert_intermediate_size), shared_gate=True)


FAMILY = replace(
    MIXTRAL, name="qwen2_moe", title="Qwen2-MoE", model_types=("qwen2_moe",), moe=moe,
    d_mlp=d_expert, shared_experts="shared_expert", shared_expert_gate="shared_expert_gate",
    tiny=dict(model_type="qwen2_moe", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
              moe_intermediate_size=32, shared_expert_intermediate_size=48,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
              max_position_embeddings=64, num_experts=4, num_experts_per_tok=2,
              norm_topk_prob=False, tie_word_embeddings=False),
)
