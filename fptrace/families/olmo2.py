"""OLMo 2: norms *after* each sublayer only (no norm before attention or the MLP), and an
RMSNorm over the whole Q and K projections.

What the block recomputation changes from Llama's: the projections read the stream itself; their
outputs are normalised before the residual add (post_attention_layernorm,
post_feedforward_layernorm); Q and K are each normalised over the whole projection (all heads at
once) before RoPE. The final norm is Llama's RMSNorm.
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
    Tap,
    gguf_block_tensors,
    gguf_default_rope,
)
from fptrace.families.kinds import QkNorm
from fptrace.families.llama import FAMILY as LLAMA
from fptrace.families.llama import LLAMA_TAPS, heads
from fptrace.families.ops import (
    Steps,
    causal_attention,
    gated_mlp,
    linear,
    post_norm,
    project_qkv,
    repeat_kv,
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
    # no norm before attention: the projections read the stream x itself
    q, k, v = project_qkv(x, attn, nh, nkv, hd, s, src="x")  # (B,T,nh*hd), 2 × (B,T,nkv*hd)
    # the Q/K norms over the whole projections, the split, RoPE
    q, k, v = heads(q, k, v, attn, cfg, layer, s, model, fam)  # (B,nh,T,hd), 2 × (B,nkv,T,hd)
    k, v = repeat_kv(k, v, nh, s)  # (B, nh, T, hd) each
    y = causal_attention(q, k, v, s, window=sliding_window(cfg, layer))  # (B, T, nh*hd)
    o = linear(y, attn.o_proj)  # (B, T, C)
    s("o_proj (W_O)", "o = y · W_Oᵀ", o, keep=True, point=Point.attn_out)
    attn_out = post_norm(o, blk, "post_attention_layernorm", eps, s, "attn_out", "o",
                         Point.ln1_post)  # (B, T, C)
    x = x + attn_out  # (B, T, C)
    s("residual add", "x = x + attn_out", x, point=Point.resid_mid)

    s.section = "mlp"
    m = gated_mlp(x, mlp, s, src="x")  # (B, T, C), no norm before the MLP either
    mlp_out = post_norm(m, blk, "post_feedforward_layernorm", eps, s, "mlp_out", "m",
                        Point.ln2_post)  # (B, T, C)
    x = x + mlp_out  # (B, T, C)
    s("residual add", "x = x + mlp_out", x, point=Point.resid_post)
    return x


# llama.cpp's olmo2 graph (checked on a tiny GGUF, tests/test_gguf_reader.py): the projections
# read the stream itself; q and k after their norms over the whole projection are
# `Qcur_normed`/`Kcur_normed`, then cut into heads and rotated by halves (`Qcur`, `Kcur`: the
# converter leaves W_Q and W_K unpermuted); the stream receives the post-norms, `attn_post_norm`
# and the MLP's, which the graph names `ffn_post_norm` without the block (every block's node has
# the one name), so it is read as `l_out`'s operand 0; the attention output before its post-norm
# is not named: it is the input of the norm inside `attn_post_norm` (its operand 0's operand 0).
LLAMACPP_NAMES = LlamaCppNames(
    archs=("olmo2",), added=(Point.ln1_post, Point.ln2_post),
    operands={"ffn_post_norm": ("l_out", 0), "attn_out": ("attn_post_norm", 0, 0)},
    points={Point.embed: "embd", Point.q: "Qcur", Point.k: "Kcur", Point.v: "Vcur",
            Point.z: "kqv_out", Point.attn_out: "attn_out", Point.ln1_post: "attn_post_norm",
            Point.resid_mid: "ffn_inp", Point.mlp_gate: "ffn_gate", Point.mlp_up: "ffn_up",
            Point.mlp_act: "ffn_swiglu", Point.mlp_out: "ffn_out",
            Point.ln2_post: "ffn_post_norm", Point.resid_post: "l_out",
            Point.final_norm: "result_norm", Point.logits: "result_output"},
    weights={"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"})

# how fptrace reads an olmo2 GGUF (transformers' GGUF loader reads none): the names of
# llama.cpp's converter (gguf-py's tensor map), nothing else done to the weights (no W_Q/W_K
# permutation, the norms stored as they are). OLMo 3's files are olmo2 files with a sliding
# window (and YaRN's RoPE scaling), which this reader does not build: such a file is refused
GGUF_WEIGHTS = GGUFWeights(
    arch="olmo2", model_type="olmo2",
    config=GGUF_LLAMA_CONFIG | {
        "intermediate_size": "feed_forward_length",
        "rope_parameters": gguf_default_rope},
    tensors=GGUF_LLAMA_TENSORS
    | gguf_block_tensors(
        *GGUF_ATTENTION,
        ("self_attn.q_norm", "attn_q_norm"), ("self_attn.k_norm", "attn_k_norm"),
        ("post_attention_layernorm", "post_attention_norm"),
        ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"), ("post_feedforward_layernorm", "post_ffw_norm")),
    unread=("attention.sliding_window", "rope.scaling.type"))

FAMILY = replace(
    LLAMA, name="olmo2", title="OLMo 2", model_types=("olmo2",), recompute_block=block,
    attn_added="post_attention_layernorm", mlp_added="post_feedforward_layernorm",
    qk_norm=QkNorm.whole, attn_norm=None,
    # no norm before attention or the MLP: the projections read the stream itself
    taps={p: t for p, t in LLAMA_TAPS.items() if p not in (Point.ln1, Point.ln2, Point.resid_mid)}
    | {Point.resid_mid: Tap("mlp", "in")},
    llamacpp_names=LLAMACPP_NAMES, gguf_weights=GGUF_WEIGHTS,
    labels={"post_attention_layernorm": "norm after attention (what is added)",
            "post_feedforward_layernorm": "norm after the MLP (what is added)"},
    tiny=dict(model_type="olmo2", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
              max_position_embeddings=64, tie_word_embeddings=False),
)
