"""gpt-oss: a Llama-like block (biases on Q, K, V and O) whose attention adds a learned sink
per head (a logit every query sees, that takes part of the softmax and adds nothing), on
alternate sliding-window and full layers, and whose MLP is a mixture of experts: a router with
a bias takes the top k logits and a softmax over those k only gives their weights; each expert
is a clamped SwiGLU with biases, (up + 1) · gate · σ(α · gate), gate and up interleaved in one
tensor.

Explain recomputes its blocks with Llama's block: the sinks join each row's softmax, the
experts' clamped SwiGLU is ops.moe_mlp's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from fptrace.errors import ModelLoadError
from fptrace.families import (
    GGUF_LLAMA_CONFIG,
    GGUF_LLAMA_TENSORS,
    GGUFWeights,
    Moe,
    gguf_expert_width,
    gguf_number,
)
from fptrace.families.kinds import Scoring
from fptrace.families.llama import LLAMACPP_NAMES as LLAMA_NAMES
from fptrace.families.mixtral import FAMILY as MIXTRAL
from fptrace.points import Point

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# llama.cpp's gpt-oss graph (checked on a tiny GGUF, tests/test_gguf_reader.py): Llama's names up
# to the MLP, q, k and v with their biases (`Qcur`, `Kcur`, `Vcur`, rotated by halves: the
# converter leaves W_Q and W_K unpermuted), the attention output with its bias `attn_out`; the
# norm before the MLP is `attn_post_norm` (gpt-oss's post_attention_layernorm); the MoE
# block's output `ffn_moe_out`. The router's logits with its bias are named `ffn_moe_probs`
# (gpt-oss's gating takes the logits as they are, and llama.cpp names the biased sum again),
# the experts chosen `ffn_moe_topk`, their weights, a softmax over the k chosen logits,
# `ffn_moe_weights_softmax`. The sinks join each row's softmax inside the attention: no node
# of their own.
LLAMACPP_NAMES = replace(
    LLAMA_NAMES, rope_adjacent=False, points=LLAMA_NAMES.points | {Point.ln2: "attn_post_norm"},
    no_emulation="gpt-oss's experts hold gate and up interleaved, (d, 2·I) each with biases, "
                 "and its attention adds a sink to each row's softmax, neither of which the "
                 "act-q8 and attn steps compute").routed(
    "gpt-oss", "ffn_moe_out", ("ffn_moe_probs", "ffn_moe_topk", "ffn_moe_weights_softmax"),
    experts={})


def layer_types(hparam: Callable[[str], object]) -> list[str] | None:
    """llama.cpp's gpt-oss windows every other block, the first among them (its swa pattern
    of 2), as gpt-oss's config does; None without a window."""
    n = hparam("block_count")
    if not hparam("attention.sliding_window") or not isinstance(n, int):
        return None
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]


def rope_parameters(hparam: Callable[[str], object]) -> dict:
    """gpt-oss's RoPE: YaRN where the file says so (its converter always does), with the
    correction range as gpt-oss's config has it (beta 32 and 1, not truncated to whole
    dimensions); plain RoPE without the keys."""
    theta = gguf_number(hparam("rope.freq_base"), 150000.0)
    kind, factor = hparam("rope.scaling.type"), hparam("rope.scaling.factor")
    if kind is None:
        return {"rope_type": "default", "rope_theta": theta}
    if kind != "yarn" or not isinstance(factor, (int, float)):
        raise ModelLoadError(f"a gpt-oss GGUF file with the RoPE scaling {kind!r} (factor "
                             f"{factor!r}): fptrace's reader reads gpt-oss's YaRN only")
    return {"rope_type": "yarn", "rope_theta": theta, "factor": float(factor),
            "original_max_position_embeddings": int(gguf_number(
                hparam("rope.scaling.original_context_length"), 4096)),
            "beta_fast": gguf_number(hparam("rope.scaling.yarn_beta_fast"), 32.0),
            "beta_slow": gguf_number(hparam("rope.scaling.yarn_beta_slow"), 1.0),
            "truncate": TRUNCATE}


# whether YaRN's correction range is rounded to whole dimensions: gpt-oss's config says not;
# llama.cpp's ggml_rope_yarn_corr_dims always rounds it (floor and ceil)
TRUNCATE = False

# how fptrace reads a gpt-oss GGUF (transformers' GGUF loader cannot: gguf_metadata's
# LOADER_GAPS said why): the names of llama.cpp's converter; the experts' gate and up, which
# transformers keeps interleaved in one (E, d, 2·I) tensor with its bias, are two tensors each
# in the file, transposed ((E, I, d)); down_proj is transposed too; the sinks are
# `attn_sinks.weight`; the router's bias is `ffn_gate_inp.bias`. The SwiGLU's α and clamp are
# gpt-oss's constants in both engines (the file has no key for them).
GGUF_WEIGHTS = GGUFWeights(
    arch="gpt-oss", model_type="gpt_oss",
    config=GGUF_LLAMA_CONFIG | {
        "intermediate_size": gguf_expert_width, "head_dim": "attention.key_length",
        "num_local_experts": "expert_count", "num_experts_per_tok": "expert_used_count",
        "sliding_window": "attention.sliding_window", "layer_types": layer_types,
        "rope_parameters": rope_parameters},
    tensors=GGUF_LLAMA_TENSORS | {
             "model.layers.{i}.self_attn.sinks": "blk.{i}.attn_sinks.weight",
             "model.layers.{i}.mlp.experts.gate_up_proj": ("blk.{i}.ffn_gate_exps.weight",
                                                          "blk.{i}.ffn_up_exps.weight"),
             "model.layers.{i}.mlp.experts.gate_up_proj_bias": ("blk.{i}.ffn_gate_exps.bias",
                                                               "blk.{i}.ffn_up_exps.bias"),
             "model.layers.{i}.mlp.experts.down_proj": "blk.{i}.ffn_down_exps.weight",
             "model.layers.{i}.mlp.experts.down_proj_bias": "blk.{i}.ffn_down_exps.bias",
             "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
             "model.layers.{i}.post_attention_layernorm.weight":
                 "blk.{i}.post_attention_norm.weight"}
    | {f"model.layers.{{i}}.{hf}.{kind}": f"blk.{{i}}.{gg}.{kind}" for hf, gg in (
        ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"),
        ("mlp.router", "ffn_gate_inp")) for kind in ("weight", "bias")},
    fixes={"model.layers.{i}.mlp.experts.gate_up_proj": "gate_up_interleaved",
           "model.layers.{i}.mlp.experts.gate_up_proj_bias": "gate_up_bias_interleaved",
           "model.layers.{i}.mlp.experts.down_proj": "transposed"},
    unread=("attention.sliding_window_pattern", "rope.scaling.yarn_ext_factor",
            "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_log_multiplier"))


def moe(cfg: PretrainedConfig) -> Moe | None:
    n = getattr(cfg, "num_local_experts", 0)
    if not n:
        return None
    return Moe(n_experts=int(n), top_k=int(cfg.num_experts_per_tok),
               d_expert=int(cfg.intermediate_size), scoring=Scoring.softmax_top_k,
               router_bias=True)


FAMILY = replace(
    MIXTRAL, name="gpt_oss", title="gpt-oss", model_types=("gpt_oss",), moe=moe,
    router="router", attn_sinks="sinks", llamacpp_names=LLAMACPP_NAMES,
    gguf_weights=GGUF_WEIGHTS,
    tiny=dict(model_type="gpt_oss", num_hidden_layers=2, hidden_size=64, intermediate_size=32,
              head_dim=16, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
              num_experts_per_tok=2, sliding_window=4, vocab_size=1000,
              max_position_embeddings=64,
              layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False),
)
