"""OLMoE: OLMo's block (one RMSNorm over the whole Q and the whole K projection, before they
are split into heads) in front of the usual pre-norms, with a sparse mixture of experts of
intermediate_size each; the chosen probabilities are renormalised only when norm_topk_prob
says so."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fptrace.families import (
    GGUF_ATTENTION,
    GGUF_LLAMA_CONFIG,
    GGUF_LLAMA_TENSORS,
    GGUFWeights,
    Moe,
    gguf_block_tensors,
    gguf_default_rope,
    gguf_expert_width,
)
from fptrace.families.kinds import QkNorm
from fptrace.families.llama import LLAMACPP_NAMES as LLAMA_NAMES
from fptrace.families.mixtral import FAMILY as MIXTRAL

# llama.cpp's olmoe graph (checked on a tiny GGUF, tests/test_gguf_reader.py): Llama's names up
# to the MLP, q and k normalised over the whole projection first (`Qcur_normed`,
# `Kcur_normed`), rotated by halves (the converter leaves W_Q and W_K unpermuted); the
# attention output is not named: `ffn_inp`'s operand 0 is it. The MoE block's output is
# `ffn_moe_out`; its router's logits `ffn_moe_logits`, the experts chosen `ffn_moe_topk` and
# their weights, not renormalised, `ffn_moe_weights`.
LLAMACPP_NAMES = replace(LLAMA_NAMES, rope_adjacent=False,
                         operands={"attn_out": ("ffn_inp", 0)}).routed(
    "olmoe", "ffn_moe_out", ("ffn_moe_logits", "ffn_moe_topk", "ffn_moe_weights"),
    experts={"mlp.experts": ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")})

# how fptrace reads an olmoe GGUF (transformers' GGUF loader reads none): the names of
# llama.cpp's converter (gguf-py's tensor map), the experts' gate and up, which it keeps as two
# tensors of every block's experts, stacked into transformers' gate_up_proj; llama.cpp's olmoe
# never renormalises the chosen weights (the file has no key for it)
GGUF_WEIGHTS = GGUFWeights(
    arch="olmoe", model_type="olmoe",
    config=GGUF_LLAMA_CONFIG | {
        "intermediate_size": gguf_expert_width,
        "num_experts": "expert_count", "num_experts_per_tok": "expert_used_count",
        "norm_topk_prob": False,
        "rope_parameters": gguf_default_rope},
    tensors=GGUF_LLAMA_TENSORS | {
             "model.layers.{i}.mlp.experts.gate_up_proj": ("blk.{i}.ffn_gate_exps.weight",
                                                          "blk.{i}.ffn_up_exps.weight"),
             "model.layers.{i}.mlp.experts.down_proj": "blk.{i}.ffn_down_exps.weight"}
    | gguf_block_tensors(
        *GGUF_ATTENTION,
        ("self_attn.q_norm", "attn_q_norm"), ("self_attn.k_norm", "attn_k_norm"),
        ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"),
        ("mlp.gate", "ffn_gate_inp")),
    unread=("rope.scaling.type",))


def moe(cfg: Any) -> Moe | None:
    n = getattr(cfg, "num_experts", 0)
    if not n:
        return None
    return Moe(n_experts=int(n), top_k=int(cfg.num_experts_per_tok),
               d_expert=int(cfg.intermediate_size),
               renormalise=bool(getattr(cfg, "norm_topk_prob", False)))


FAMILY = replace(
    MIXTRAL, name="olmoe", title="OLMoE", model_types=("olmoe",), qk_norm=QkNorm.whole, moe=moe,
    llamacpp_names=LLAMACPP_NAMES, gguf_weights=GGUF_WEIGHTS,
    tiny=dict(model_type="olmoe", num_hidden_layers=2, hidden_size=64, intermediate_size=32,
              num_attention_heads=4, num_key_value_heads=4, vocab_size=1000,
              max_position_embeddings=64, num_experts=8, num_experts_per_tok=2,
              norm_topk_prob=False, tie_word_embeddings=False),
)
