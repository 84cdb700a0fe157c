"""Gemma (1): the embedding scaled by √d, RMSNorm with a (1 + w) scale, GeGLU MLP.

The block recomputation below serves Gemma 2 and Gemma 3 too, reading what differs from their
family records: the post-norms (the attention and MLP outputs normalised *before* they are added
to the stream), the attention softcap and the per-head Q/K norm. Every Gemma scales the scores by
query_pre_attn_scalar^−½ where the config sets it; sliding-window layers and per-layer-type RoPE
bases come from the config. The embedding's √d scale happens before block 0, so it is already in x.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fptrace.families import (
    GGUF_ATTENTION,
    GGUF_LLAMA_CONFIG,
    GGUF_LLAMA_TENSORS,
    Family,
    GGUFWeights,
    LlamaCppNames,
    gguf_block_tensors,
    gguf_default_rope,
)
from fptrace.families.kinds import EmbedScale, MlpKind, NormKind
from fptrace.families.llama import FAMILY as LLAMA
from fptrace.families.llama import heads
from fptrace.families.ops import (
    RMS_1W_FORMULA,
    Steps,
    attention_scale,
    causal_attention,
    gated_mlp,
    linear,
    post_norm,
    project_qkv,
    repeat_kv,
    rms_norm,
    sliding_window,
)
from fptrace.families.parts import dims
from fptrace.points import Point

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig


def block(x: torch.Tensor, blk: Any, cfg: PretrainedConfig, layer: int, s: Steps, model: nn.Module,
          fam: Family) -> torch.Tensor:
    """x: (B, T, C), the residual stream entering block `layer`. Returns the stream leaving it."""
    B, T, C = x.shape
    dm = dims(cfg)  # the config's head counts and head width, normalised once
    nh, nkv, hd = dm.n_heads, dm.n_kv_heads, dm.head_dim
    eps = cfg.rms_norm_eps
    attn, mlp = blk.self_attn, blk.mlp

    s.section = "attention"
    h = rms_norm(x, blk.input_layernorm.weight, eps, one_plus=True)  # (B, T, C)
    s("input_layernorm (RMSNorm, 1 + γ)", RMS_1W_FORMULA, h, point=Point.ln1)
    q, k, v = project_qkv(h, attn, nh, nkv, hd, s)  # (B, T, nh*hd), 2 × (B, T, nkv*hd)
    # split, the per-head (1 + γ) Q/K norm of Gemma 3, RoPE with the layer type's base
    q, k, v = heads(q, k, v, attn, cfg, layer, s, model, fam)  # (B,nh,T,hd), 2 × (B,nkv,T,hd)
    k, v = repeat_kv(k, v, nh, s)  # (B, nh, T, hd) each
    y = causal_attention(q, k, v, s, scale=attention_scale(cfg, layer, hd),
                         window=sliding_window(cfg, layer),
                         softcap=fam.softcap(cfg, "attn"))  # (B, T, nh*hd)
    attn_out = linear(y, attn.o_proj)  # (B, T, C)
    s("o_proj (W_O)", "o = y · W_Oᵀ", attn_out, keep=True, point=Point.attn_out)
    attn_out = post_norm(attn_out, blk, fam.attn_added, eps, s, "attn_out", "o",
                         Point.ln1_post, one_plus=True)  # (B, T, C)
    x = x + attn_out  # (B, T, C)
    s("residual add", "x = x + attn_out", x, point=Point.resid_mid)

    s.section = "mlp"
    pre = "pre_feedforward_layernorm" if fam.post_norms else "post_attention_layernorm"
    h = rms_norm(x, blk.get_submodule(pre).weight, eps, one_plus=True)  # (B, T, C)
    s(pre, RMS_1W_FORMULA, h, point=Point.ln2)
    act = getattr(cfg, "hidden_activation", None) or cfg.hidden_act
    mlp_out = gated_mlp(h, mlp, s, act=act)  # (B, T, C)
    mlp_out = post_norm(mlp_out, blk, fam.mlp_added, eps, s, "mlp_out", "m",
                        Point.ln2_post, one_plus=True)  # (B, T, C)
    x = x + mlp_out  # (B, T, C)
    s("residual add", "x = x + mlp_out", x, point=Point.resid_post)
    return x


def final_norm(x: torch.Tensor, norm: Any, cfg: PretrainedConfig, s: Steps) -> torch.Tensor:
    h = rms_norm(x, norm.weight, cfg.rms_norm_eps, one_plus=True)  # (B, T, C)
    s("norm (final RMSNorm, 1 + γ)", RMS_1W_FORMULA, h, point=Point.final_norm)
    return h


# llama.cpp's gemma graph (checked on a tiny GGUF, tests/test_llamacpp_families.py): Gemma 2's
# names without the post-norms and softcaps: the embedding after its √d scale is `inp_scaled`;
# q, k (rotated by halves: the converter leaves W_Q and W_K unpermuted) and v are `Qcur`,
# `Kcur`, `Vcur` before q's scale (`Qcur_scaled`); the attention output is not named: `sa_out`,
# the stream after it, is its sum with the block's input, whose operand 0 it is; the MLP's
# GELU(gate)·up is `ffn_geglu`, its output `ffn_out`
LLAMACPP_NAMES = LlamaCppNames(
    archs=("gemma",), operands={"attn_out": ("sa_out", 0)},
    points={Point.embed: "inp_scaled", Point.ln1: "attn_norm", Point.q: "Qcur",
            Point.k: "Kcur", Point.v: "Vcur", Point.z: "kqv_out", Point.attn_out: "attn_out",
            Point.resid_mid: "sa_out", Point.ln2: "ffn_norm", Point.mlp_gate: "ffn_gate",
            Point.mlp_up: "ffn_up", Point.mlp_act: "ffn_geglu", Point.mlp_out: "ffn_out",
            Point.resid_post: "l_out", Point.final_norm: "result_norm",
            Point.logits: "result_output"},
    no_emulation="Gemma's RMSNorm multiplies by (1 + w), which the norm step does not, and its "
                 "GELU comes from ggml's float16 table, which no step reproduces")

# how fptrace reads a gemma GGUF (transformers' GGUF loader reads Gemma 2's and 3's, not
# Gemma 1's): the names of llama.cpp's converter (gguf-py's tensor map), the head tied to the
# token embedding (the file has no output tensor), each norm's weight stored with the 1 Gemma's
# RMSNorm adds (taken off here), W_Q and W_K unpermuted; the head width from the file
# (transformers' Gemma config takes 256 where it is not given)
GGUF_WEIGHTS = GGUFWeights(
    arch="gemma", model_type="gemma",
    config=GGUF_LLAMA_CONFIG | {
        "intermediate_size": "feed_forward_length", "head_dim": "attention.key_length",
        "rope_parameters": gguf_default_rope},
    tensors=GGUF_LLAMA_TENSORS
    | gguf_block_tensors(
        *GGUF_ATTENTION,
        ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"),
        ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down")),
    fixes={"model.norm.weight": "one_added",
           "model.layers.{i}.input_layernorm.weight": "one_added",
           "model.layers.{i}.post_attention_layernorm.weight": "one_added"},
    unread=("rope.scaling.type", "attention.sliding_window"))

FAMILY = replace(
    LLAMA, name="gemma", title="Gemma", model_types=("gemma",),
    norm_type=NormKind.rmsnorm_one_plus, mlp_type=MlpKind.geglu, embed_scale=EmbedScale.sqrt_d,
    recompute_block=block, recompute_final_norm=final_norm,
    llamacpp_names=LLAMACPP_NAMES, gguf_weights=GGUF_WEIGHTS,
    tiny=dict(model_type="gemma", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
              num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=1000,
              max_position_embeddings=64),
)
