"""Mixtral: Mistral's block with a sparse mixture of experts in place of the MLP.

A router (mlp.gate, a linear map d → E) scores the experts; each token takes the top k by
softmax probability, their probabilities renormalised to sum to 1; the routed experts are SwiGLU
MLPs stored as 3-D tensors (mlp.experts.gate_up_proj (E, 2·I, d), mlp.experts.down_proj
(E, d, I)). Qwen2-MoE, Qwen3-MoE and OLMoE are this record with a few facts changed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from fptrace.families import (
    GGUF_ATTENTION,
    GGUF_LLAMA_CONFIG,
    GGUF_LLAMA_TENSORS,
    GGUFWeights,
    Moe,
    Tap,
    gguf_block_tensors,
    gguf_default_rope,
)
from fptrace.families.kinds import MlpKind
from fptrace.families.llama import FAMILY as LLAMA
from fptrace.families.llama import LLAMA_TAPS
from fptrace.families.llama import LLAMACPP_NAMES as LLAMA_NAMES
from fptrace.points import Point

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def moe(cfg: PretrainedConfig) -> Moe | None:
    """Mixtral's experts: num_local_experts of intermediate_size, top num_experts_per_tok,
    always renormalised."""
    n = getattr(cfg, "num_local_experts", 0)
    if not n:
        return None
    return Moe(n_experts=int(n), top_k=int(cfg.num_experts_per_tok),
               d_expert=int(cfg.intermediate_size), renormalise=True)


# where an MoE block shows its points: the MLP module's output (its first item) is what the
# stream receives; the experts' inner activations are per expert and show in no one module
MOE_TAPS = {p: t for p, t in LLAMA_TAPS.items()
            if p not in (Point.mlp_gate, Point.mlp_up, Point.mlp_act)} | {Point.mlp_out: Tap("mlp")}

# llama.cpp's converter writes Mixtral as a `llama` file with experts (an expert count, and per
# block the router `ffn_gate_inp` and the experts' `ffn_gate_exps`, `ffn_up_exps`,
# `ffn_down_exps`), and llama.cpp's llama graph runs its MoE branch on it (checked on a tiny
# GGUF, tests/test_llamacpp_families.py): Llama's names up to the MLP (W_Q and W_K permuted by
# the converter, pairs rotated side by side); the MoE block's output, what the stream receives,
# is `ffn_moe_out` (the graph's `ffn_out` is the stream after it); its router's logits
# `ffn_moe_logits`, the experts chosen `ffn_moe_topk` and their weights, always renormalised,
# `ffn_moe_weights_norm`
LLAMACPP_NAMES = LLAMA_NAMES.routed(
    "llama", "ffn_moe_out", ("ffn_moe_logits", "ffn_moe_topk", "ffn_moe_weights_norm"),
    experts={"mlp.experts": ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")})

# how fptrace reads a Mixtral GGUF: transformers' GGUF loader builds a `llama` file as a Llama,
# whose dense MLP no tensor fills (fptrace refuses that), so a `llama` file stating an expert
# count is read here as Mixtral: the names of llama.cpp's converter, W_Q and W_K put back from
# its permutation, the experts' gate and up (two tensors per block in the file) stacked into
# transformers' gate_up_proj. What llama.cpp's llama reads and this reader does not (a RoPE
# scaling, a weights scale, Granite's shared experts) refuses the file
GGUF_WEIGHTS = GGUFWeights(
    arch="llama", model_type="mixtral", experts=True,
    config=GGUF_LLAMA_CONFIG | {
        "intermediate_size": "feed_forward_length",
        "num_local_experts": "expert_count", "num_experts_per_tok": "expert_used_count",
        "head_dim": "attention.key_length", "sliding_window": None,
        "rope_parameters": gguf_default_rope},
    tensors=GGUF_LLAMA_TENSORS | {
        "model.layers.{i}.mlp.experts.gate_up_proj": ("blk.{i}.ffn_gate_exps.weight",
                                                     "blk.{i}.ffn_up_exps.weight"),
        "model.layers.{i}.mlp.experts.down_proj": "blk.{i}.ffn_down_exps.weight"}
    | gguf_block_tensors(
        *GGUF_ATTENTION,
        ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"),
        ("mlp.gate", "ffn_gate_inp")),
    fixes={"model.layers.{i}.self_attn.q_proj.weight": "rope_adjacent_q",
           "model.layers.{i}.self_attn.k_proj.weight": "rope_adjacent_k"},
    unread=("rope.scaling.type", "expert_weights_scale", "expert_shared_feed_forward_length",
            "attention.sliding_window"))

FAMILY = replace(
    LLAMA, name="mixtral", title="Mixtral", model_types=("mixtral",), mlp_type=MlpKind.moe, moe=moe,
    taps=MOE_TAPS, llamacpp_names=LLAMACPP_NAMES, gguf_weights=GGUF_WEIGHTS,
    # a dense SwiGLU MLP of the family (Qwen2-MoE's shared expert, DeepSeek-V3's shared experts
    # and first blocks, the Qwen-MoE mlp_only_layers): Llama's projections
    moe_dense_mlp=("gate_proj", "up_proj", "down_proj"),
    tiny=dict(model_type="mixtral", num_hidden_layers=2, hidden_size=64, intermediate_size=48,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
              max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2,
              sliding_window=None, tie_word_embeddings=False),
)
