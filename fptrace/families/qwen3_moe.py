"""Qwen3-MoE: Qwen3's block (a per-head RMSNorm on Q and K) with Mixtral's kind of sparse
mixture of experts, of moe_intermediate_size each; the chosen probabilities are renormalised
only when the config's norm_topk_prob says so. Blocks listed in mlp_only_layers (or off the
decoder_sparse_step) keep a dense MLP of intermediate_size."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from fptrace.families import Moe
from fptrace.families.kinds import QkNorm
from fptrace.families.mixtral import FAMILY as MIXTRAL
from fptrace.families.qwen3 import LLAMACPP_NAMES as QWEN3_NAMES

if TYPE_CHECKING:
    from transformers import PretrainedConfig


# llama.cpp's qwen3moe graph (checked on a tiny GGUF, tests/test_llamacpp_families.py): Qwen3's
# names up to the MLP; the MoE block's output, what the stream receives, is `ffn_moe_out`; its
# router's logits `ffn_moe_logits`, the experts chosen `ffn_moe_topk` and their weights, always
# renormalised, `ffn_moe_weights_norm`. The experts' own products are not compared point by
# point (each position's go through its own experts)
LLAMACPP_NAMES = QWEN3_NAMES.routed(
    "qwen3moe", "ffn_moe_out", ("ffn_moe_logits", "ffn_moe_topk", "ffn_moe_weights_norm"),
    experts={"mlp.experts": ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")})


def moe(cfg: PretrainedConfig) -> Moe | None:
    n = getattr(cfg, "num_experts", 0)
    if not n:
        return None
    return Moe(n_experts=int(n), top_k=int(cfg.num_experts_per_tok),
               d_expert=int(cfg.moe_intermediate_size),
               renormalise=bool(getattr(cfg, "norm_topk_prob", False)))


def d_expert(cfg: PretrainedConfig) -> int | None:
    """The width an MoE block's expert has (the dense intermediate_size is no MoE block's)."""
    return getattr(cfg, "moe_intermediate_size", None) if getattr(cfg, "num_experts", 0) \
        else getattr(cfg, "intermediate_size", None)


FAMILY = replace(
    MIXTRAL, name="qwen3_moe", title="Qwen3-MoE", model_types=("qwen3_moe",),
    qk_norm=QkNorm.per_head,
    moe=moe, d_mlp=d_expert, llamacpp_names=LLAMACPP_NAMES,
    gguf_weights=None,  # transformers' GGUF loader reads qwen3moe (not Mixtral's reader)
    # what transformers' GGUF loader leaves at Qwen3-MoE's defaults: the head width, the
    # experts' width, and the renormalisation of the chosen weights, which llama.cpp's qwen3moe
    # always does (the GGUF has no key for it)
    gguf_config={"head_dim": "attention.key_length",
                 "moe_intermediate_size": "expert_feed_forward_length", "norm_topk_prob": True},
    tiny=dict(model_type="qwen3_moe", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
              moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, vocab_size=1000, max_position_embeddings=64, num_experts=8,
              num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=False),
)
