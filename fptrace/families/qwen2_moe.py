"""Qwen2-MoE: Qwen2's block (biases on Q, K, V) with a sparse mixture of experts of
moe_intermediate_size each plus one shared expert (a SwiGLU MLP of
shared_expert_intermediate_size) that every token takes, its output scaled by
σ(shared_expert_gate · x), a gate of its own."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from fptrace.families import Moe
from fptrace.families.mixtral import FAMILY as MIXTRAL
from fptrace.families.qwen2 import LLAMACPP_NAMES as QWEN2_NAMES
from fptrace.families.qwen3_moe import d_expert
from fptrace.families.qwen3_moe import moe as qwen3_moe

if TYPE_CHECKING:
    from transformers import PretrainedConfig


# llama.cpp's qwen2moe graph (checked on a tiny GGUF, tests/test_llamacpp_families.py): Qwen2's
# names up to the MLP (the attention output, unnamed, is ffn_inp's operand 0). The MoE block's
# output, what the stream receives, is `ffn_out`: the routed experts' sum `ffn_moe_out` plus the
# shared expert's output `ffn_shexp` times its gate σ(`ffn_shexp_gate_inp`) (`ffn_shexp_gate`,
# which ggml computes as SiLU(x)/x), `ffn_shexp_out`. The router's logits are `ffn_moe_logits`,
# the experts chosen `ffn_moe_topk` and their weights, never renormalised in llama.cpp's
# qwen2moe, `ffn_moe_weights`. The shared expert's own gate, up and SwiGLU are named `ffn_gate`,
# `ffn_up`, `ffn_swiglu` (Llama's MLP names), so those are left unmapped: they are not the
# block's MLP
LLAMACPP_NAMES = QWEN2_NAMES.routed(
    "qwen2moe", "ffn_out", ("ffn_moe_logits", "ffn_moe_topk", "ffn_moe_weights"),
    weights=QWEN2_NAMES.weights | {
        "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj":
        "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
        "mlp.shared_expert_gate": "ffn_gate_inp_shexp"},
    experts={"mlp.experts": ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")})


def moe(cfg: PretrainedConfig) -> Moe | None:
    """Qwen3-MoE's experts, plus the one shared expert with its own gate."""
    routed = qwen3_moe(cfg)
    if routed is None:
        return None
    return replace(routed, n_shared=1, d_shared=int(cfg.shared_expert_intermediate_size),
                   shared_gate=True)


FAMILY = replace(
    MIXTRAL, name="qwen2_moe", title="Qwen2-MoE", model_types=("qwen2_moe",), moe=moe,
    d_mlp=d_expert, shared_experts="shared_expert", shared_expert_gate="shared_expert_gate",
    llamacpp_names=LLAMACPP_NAMES, gguf_weights=None,  # transformers' loader reads it
    # what transformers' GGUF loader leaves at Qwen2-MoE's defaults: the routed and the shared
    # experts' widths; and the chosen weights not renormalised, as llama.cpp's qwen2moe never
    # does (the GGUF has no key for it; the loader's default already agrees)
    gguf_config={"moe_intermediate_size": "expert_feed_forward_length",
                 "shared_expert_intermediate_size": "expert_shared_feed_forward_length",
                 "norm_topk_prob": False},
    tiny=dict(model_type="qwen2_moe", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
              moe_intermediate_size=32, shared_expert_intermediate_size=48,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
              max_position_embeddings=64, num_experts=4, num_experts_per_tok=2,
              norm_topk_prob=False, tie_word_embeddings=False),
)
