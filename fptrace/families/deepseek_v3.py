"""DeepSeek-V3: multi-head latent attention (Q and K/V through low-rank latents, part of
each head rotated, part not) and, after first_k_dense_replace dense blocks, a mixture of
n_routed_experts experts plus n_shared_experts shared ones. Its router scores each expert with
a sigmoid; the choice adds a learned correction bias (e_score_correction_bias) and keeps only
the topk_group best of n_group groups of experts (a group's worth: the sum of its two best
scores); the weights are the chosen experts' uncorrected scores, renormalised when
norm_topk_prob says so, times routed_scaling_factor.

Traced and counted (shapes, run, routing); explain does not recompute its blocks yet, and
`diff --deep` compares its blocks at the block level and its MLA by the output projection."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fptrace.points import Point
from fptrace.families import Moe, Tap
from fptrace.families.mixtral import FAMILY as MIXTRAL


def moe(cfg: Any) -> Moe | None:
    n = getattr(cfg, "n_routed_experts", 0)
    if not n:
        return None
    return Moe(n_experts=int(n), top_k=int(cfg.num_experts_per_tok),
               d_expert=int(cfg.moe_intermediate_size), n_shared=int(cfg.n_shared_experts or 0),
               d_shared=int(cfg.moe_intermediate_size) * int(cfg.n_shared_experts or 0),
               scoring="sigmoid", renormalise=bool(cfg.norm_topk_prob),
               scale=float(cfg.routed_scaling_factor), n_groups=int(cfg.n_group or 1),
               topk_groups=int(cfg.topk_group or 1), score_bias=True)


def d_expert(cfg: Any) -> int | None:
    return getattr(cfg, "moe_intermediate_size", None)


def kv_cache_values(cfg: Any) -> int:
    """MLA caches, per block and token, the K/V latent and the one RoPE key all heads share."""
    return int(cfg.kv_lora_rank) + int(cfg.qk_rope_head_dim)


# MLA has no q_proj/k_proj of the usual shapes: the points a Llama-like block shows outside them
MLA_TAPS = {
    Point.ln1: Tap("input_layernorm"),
    Point.z: Tap("self_attn.o_proj", "in"), Point.attn_out: Tap("self_attn.o_proj"),
    Point.resid_mid: Tap("post_attention_layernorm", "in"),
    Point.ln2: Tap("post_attention_layernorm"), Point.mlp_out: Tap("mlp"),
}

FAMILY = replace(
    MIXTRAL, name="deepseek_v3", title="DeepSeek-V3", model_types=("deepseek_v3",), moe=moe,
    d_mlp=d_expert, shared_experts="shared_experts", taps=MLA_TAPS, qk_weights=None,
    heads=None, head_taps=(), recompute_block=None, recompute_final_norm=None,
    kv_cache_values=kv_cache_values, head_dim_attr="v_head_dim",
    router_score_bias="e_score_correction_bias",
    labels={**MIXTRAL.labels, "q_a_proj": "Q down-projection (latent)",
            "q_b_proj": "Q up-projection", "kv_a_proj_with_mqa": "K/V latent and shared RoPE K",
            "kv_b_proj": "K/V up-projection", "q_a_layernorm": "Q latent norm",
            "kv_a_layernorm": "K/V latent norm"},
    tiny=dict(model_type="deepseek_v3", num_hidden_layers=3, hidden_size=64,
              intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
              num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
              routed_scaling_factor=2.5, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
              v_head_dim=16, qk_nope_head_dim=16, n_group=4, topk_group=2,
              num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True,
              vocab_size=1000, max_position_embeddings=64, rope_interleave=True,
              tie_word_embeddings=False),
)
