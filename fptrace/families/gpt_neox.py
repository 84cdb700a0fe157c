"""GPT-NeoX (Pythia): LayerNorm, per-head fused QKV, partial rotary, parallel residual by
default (attention and MLP both read the block's input).

The block recomputation in the manner of nanoGPT: B batch, T positions, C = hidden_size, nh
heads of hs values. Three things differ from GPT-2: the fused QKV projection is laid out head by
head ([q|k|v] for head 0, then head 1, ...), RoPE rotates only the first `rotary_ndims` values of
each head, and with `use_parallel_residual` attention and the MLP both read the block's input
and are added together.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fptrace.families import Family, GGUFWeights, LlamaCppNames, Tap
from fptrace.families.kinds import MlpKind, NormKind, PositionKind
from fptrace.families.ops import (
    LAYERNORM_FORMULA,
    Steps,
    apply_rope,
    causal_attention,
    gelu,
    layer_norm,
    linear,
    rope_tables,
    rotary_dims,
)
from fptrace.points import Point

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig


def heads(qkv: torch.Tensor, attn: Any, cfg: PretrainedConfig, layer: int, s: Steps,
          model: nn.Module, fam: Family) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv (B, T, 3C), query_key_value's output laid out head by head -> q, k, v (B, nh, T, hs),
    q and k rotated on the first rotary_ndims values of each head."""
    B, T, C3 = qkv.shape
    nh = cfg.num_attention_heads
    hs = C3 // 3 // nh
    rot = rotary_dims(cfg, hs)
    qkv = qkv.view(B, T, nh, 3 * hs).transpose(1, 2)  # (B, nh, T, 3hs)
    q, k, v = qkv.chunk(3, dim=-1)  # 3 × (B, nh, T, hs)
    s("heads, then split", f"qkv → (B, {nh}, T, 3·{hs}); q, k, v = its thirds (per head)", q,
      note="K and V have the same shape", shown="Q")
    cos, sin, formula = rope_tables(cfg, T, rot, model, q.device)  # (T, rot) each
    q = apply_rope(q, cos, sin)  # (B, nh, T, hs)
    k = apply_rope(k, cos, sin)  # (B, nh, T, hs)
    s("RoPE on Q and K", f"the first {rot} of {hs} values per head: " + formula, q,
      note="K is rotated the same way; the other values pass unchanged", shown="Q",
      point=Point.q)
    return q, k, v


def block(x: torch.Tensor, blk: Any, cfg: PretrainedConfig, layer: int, s: Steps, model: nn.Module,
          fam: Family) -> torch.Tensor:
    """x: (B, T, C), the residual stream entering block `layer`. Returns the stream leaving it."""
    B, T, C = x.shape
    eps = cfg.layer_norm_eps
    parallel = bool(getattr(cfg, "use_parallel_residual", True))
    attn, mlp = blk.attention, blk.mlp

    s.section = "attention"
    h = layer_norm(x, blk.input_layernorm, eps)  # (B, T, C)
    s("input_layernorm", LAYERNORM_FORMULA, h, point=Point.ln1)
    qkv = linear(h, attn.query_key_value)  # (B, T, 3C)
    s("query_key_value (fused)", f"qkv = h · W_qkvᵀ + b   W_qkv is ({3 * C}, {C})", qkv)
    q, k, v = heads(qkv, attn, cfg, layer, s, model, fam)  # 3 × (B, nh, T, hs)
    y = causal_attention(q, k, v, s)  # (B, T, C)
    attn_out = linear(y, attn.dense)  # (B, T, C)
    s("dense (W_O)", "attn_out = y · W_Oᵀ + b", attn_out, keep=True, point=Point.attn_out)

    s.section = "mlp"
    if parallel:
        h = layer_norm(x, blk.post_attention_layernorm, eps)  # (B, T, C)
        s("post_attention_layernorm", "h = LayerNorm(x)   (parallel: the block's input, not "
          "x + attn_out)", h, point=Point.ln2)
    else:
        x = x + attn_out  # (B, T, C)
        s("residual add", "x = x + attn_out", x, point=Point.resid_mid)
        h = layer_norm(x, blk.post_attention_layernorm, eps)  # (B, T, C)
        s("post_attention_layernorm", LAYERNORM_FORMULA, h, point=Point.ln2)
    u = linear(h, mlp.dense_h_to_4h)  # (B, T, 4C)
    s("dense_h_to_4h (MLP up)", f"u = h · W_upᵀ + b   W_up is ({u.shape[-1]}, {C})", u,
      point=Point.mlp_up)
    a, formula = gelu(u, cfg.hidden_act)  # (B, T, 4C)
    s("GELU", formula, a, point=Point.mlp_act)
    mlp_out = linear(a, mlp.dense_4h_to_h)  # (B, T, C)
    s("dense_4h_to_h (MLP down)", "mlp_out = a · W_downᵀ + b", mlp_out, keep=True,
      point=Point.mlp_out)
    if parallel:
        x = x + attn_out + mlp_out  # (B, T, C)
        s("residual add", "x = x + attn_out + mlp_out   (parallel residual)", x,
          point=Point.resid_post)
    else:
        x = x + mlp_out  # (B, T, C)
        s("residual add", "x = x + mlp_out", x, point=Point.resid_post)
    return x


def qk_weights(attn: Any, nh: int, nkv: int, hd: int
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """W_Q, b_Q, W_K, b_K out of the fused query_key_value, laid out head by head:
    ([q|k|v] of head 0, then head 1, ...), (3C, C)."""
    W, b = attn.query_key_value.weight, attn.query_key_value.bias  # (3C, C), (3C,)
    W = W.view(nh, 3, hd, -1)  # (nh, q/k/v, hd, C)
    b = b.view(nh, 3, hd) if b is not None else None  # (nh, q/k/v, hd)
    return (W[:, 0].reshape(nh * hd, -1), None if b is None else b[:, 0].reshape(-1),
            W[:, 1].reshape(nh * hd, -1), None if b is None else b[:, 1].reshape(-1))


def final_norm(x: torch.Tensor, norm: Any, cfg: PretrainedConfig, s: Steps) -> torch.Tensor:
    h = layer_norm(x, norm, cfg.layer_norm_eps)  # (B, T, C)
    s("final_layer_norm", LAYERNORM_FORMULA, h, point=Point.final_norm)
    return h


# llama.cpp's gptneox graph (checked on a tiny GGUF, tests/test_gguf_reader.py): each
# LayerNorm's output after its weight and bias is `attn_norm` / `ffn_norm`; q, k and v are
# `Qcur`, `Kcur`, `Vcur`, views of the fused product with its bias, cut [Q; K; V] (the converter
# writes W_qkv so), q and k rotated by halves on their first rope.dimension_count values; the MLP's
# up projection with its bias is `ffn_up_b`, its GELU `ffn_gelu`, the down projection with its
# bias `ffn_out`, a name the graph then gives the same plus the block's input too (the first is
# kept). The stream's l_out adds the attention output, which the graph leaves unnamed: its
# operand 1. With the parallel residual (the converter's default) there is no stream between
# attention and the MLP.
LLAMACPP_NAMES = LlamaCppNames(
    archs=("gptneox",), operands={"attn_out": ("l_out", 1)}, first=("ffn_out",),
    points={Point.embed: "embd", Point.ln1: "attn_norm", Point.q: "Qcur", Point.k: "Kcur",
            Point.v: "Vcur", Point.z: "kqv_out", Point.attn_out: "attn_out",
            Point.ln2: "ffn_norm", Point.mlp_up: "ffn_up_b", Point.mlp_act: "ffn_gelu",
            Point.mlp_out: "ffn_out", Point.resid_post: "l_out",
            Point.final_norm: "result_norm", Point.logits: "result_output"},
    no_emulation="GPT-NeoX's LayerNorm is no step, and its GELU comes from ggml's float16 "
                 "table, which no step reproduces")


def rotary_fraction(hparam: Callable[[str], object]) -> float | None:
    """The share of each head's values RoPE rotates: rope.dimension_count over the head's
    width."""
    rot, width, heads = (hparam("rope.dimension_count"), hparam("embedding_length"),
                         hparam("attention.head_count"))
    if not (isinstance(rot, int) and isinstance(width, int) and isinstance(heads, int)
            and heads > 0 and width % heads == 0):
        return None
    return rot / (width // heads)


# how fptrace reads a gptneox GGUF (transformers' GGUF loader reads none): the names of
# llama.cpp's converter (gguf-py's tensor map), the fused QKV put back head by head (the
# converter wrote it [Q; K; V]); llama.cpp's GELU is the tanh form, transformers' Pythia the
# exact one, which the file does not say: the config's default ("gelu") is kept
GGUF_WEIGHTS = GGUFWeights(
    arch="gptneox", model_type="gpt_neox",
    config={"hidden_size": "embedding_length", "num_hidden_layers": "block_count",
            "intermediate_size": "feed_forward_length",
            "num_attention_heads": "attention.head_count",
            "layer_norm_eps": "attention.layer_norm_epsilon",
            "max_position_embeddings": "context_length",
            "use_parallel_residual": "use_parallel_residual",
            "rope_parameters": lambda hparam: {
                "rope_type": "default", "rope_theta": hparam("rope.freq_base") or 1e4,
                "partial_rotary_factor": rotary_fraction(hparam) or 0.25}},
    tensors={"gpt_neox.embed_in.weight": "token_embd.weight",
             "gpt_neox.final_layer_norm.weight": "output_norm.weight",
             "gpt_neox.final_layer_norm.bias": "output_norm.bias",
             "lm_head.weight": "output.weight"}
    | {f"gpt_neox.layers.{{i}}.{hf}.{kind}": f"blk.{{i}}.{gg}.{kind}" for hf, gg in (
        ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"),
        ("attention.query_key_value", "attn_qkv"), ("attention.dense", "attn_output"),
        ("mlp.dense_h_to_4h", "ffn_up"), ("mlp.dense_4h_to_h", "ffn_down"))
       for kind in ("weight", "bias")},
    fixes={"gpt_neox.layers.{i}.attention.query_key_value.weight": "qkv_by_head",
           "gpt_neox.layers.{i}.attention.query_key_value.bias": "qkv_by_head"},
    unread=("rope.scaling.type",))

FAMILY = Family(
    name="gpt_neox", title="GPT-NeoX", model_types=("gpt_neox",),
    blocks="gpt_neox.layers", embed="gpt_neox.embed_in",
    final_norm="gpt_neox.final_layer_norm", lm_head="lm_head", attn="attention", mlp="mlp",
    norm_type=NormKind.layernorm, mlp_type=MlpKind.gelu, positions=PositionKind.rope,
    recompute_block=block, recompute_final_norm=final_norm,
    parallel_residual=True, parallel_residual_attr="use_parallel_residual",
    w_o=("dense",), attn_norm="input_layernorm", qk_weights=qk_weights,
    labels={"input_layernorm": "norm before attention",
            "post_attention_layernorm": "norm before the MLP",
            "query_key_value": "fused QKV projection", "dense_h_to_4h": "MLP up",
            "dense_4h_to_h": "MLP down"},
    taps={Point.ln1: Tap("input_layernorm"), Point.z: Tap("attention.dense", "in"),
          Point.attn_out: Tap("attention.dense"),
          Point.resid_mid: Tap("post_attention_layernorm", "in"),
          Point.ln2: Tap("post_attention_layernorm"), Point.mlp_up: Tap("mlp.dense_h_to_4h"),
          Point.mlp_act: Tap("mlp.dense_4h_to_h", "in"), Point.mlp_out: Tap("mlp.dense_4h_to_h")},
    head_taps=("attention.query_key_value",), heads=heads,
    llamacpp_names=LLAMACPP_NAMES, gguf_weights=GGUF_WEIGHTS,
    tiny=dict(model_type="gpt_neox", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
              num_attention_heads=4, vocab_size=1000, max_position_embeddings=64,
              rotary_pct=0.25, use_parallel_residual=True),
)
