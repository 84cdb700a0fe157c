"""One Gemma block (Gemma, Gemma 2, Gemma 3 text) and the final norm, recomputed from the
checkpoint's own weights.

What differs from Llama: every RMSNorm scales by (1 + γ), not γ; the MLP is GeGLU (GELU of the
gate, tanh approximation); Gemma 2 and 3 normalise the attention and MLP outputs *before* adding
them to the stream (post-norms), scale the scores by query_pre_attn_scalar^−½, may soft-cap
them, and alternate sliding-window and global layers; Gemma 3 also normalises each head of Q
and K and gives local and global layers different RoPE bases. The embedding's √d scale happens
before block 0, so it is already in x.
"""

from __future__ import annotations

from typing import Any

import torch

from .attention import causal_attention, repeat_kv, sliding_window
from .llama import apply_rope, gated_mlp, linear, project_qkv, rope_tables, split_heads
from ..families.parts import dims
from .steps import Steps

NORM = "h = x / √(mean(x²) + ε) · (1 + γ)"


def gemma_norm(x: Any, weight: Any, eps: float) -> Any:
    rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
    return x / rms * (1.0 + weight)  # (..., C)


def block(x: Any, blk: Any, cfg: Any, layer: int, s: Steps, model: Any) -> Any:
    """x: (B, T, C), the residual stream entering block `layer`. Returns the stream leaving it."""
    B, T, C = x.shape
    dm = dims(cfg)  # the config's head counts and head width, normalised once
    nh, nkv, hd = dm.n_heads, dm.n_kv_heads, dm.head_dim
    eps = cfg.rms_norm_eps
    attn, mlp = blk.self_attn, blk.mlp
    post_norms = hasattr(blk, "pre_feedforward_layernorm")  # Gemma 2 and 3

    s.section = "attention"
    h = gemma_norm(x, blk.input_layernorm.weight, eps)  # (B, T, C)
    s("input_layernorm (RMSNorm, 1 + γ)", NORM, h)
    q, k, v = project_qkv(h, attn, nh, nkv, hd, s)  # (B, T, nh*hd), 2 × (B, T, nkv*hd)
    q, k, v = split_heads(q, k, v, nh, nkv, hd, s)  # (B, nh, T, hd), 2 × (B, nkv, T, hd)
    if getattr(attn, "q_norm", None) is not None:  # Gemma 3
        q = gemma_norm(q, attn.q_norm.weight, eps)  # (B, nh, T, hd)
        k = gemma_norm(k, attn.k_norm.weight, eps)  # (B, nkv, T, hd)
        s("q_norm, k_norm (per head, 1 + γ)", f"q = q / √(mean(q²) + ε) · (1 + γ_q) over each "
          f"head's {hd} values; same for k", q, shown="Q")
    cos, sin, formula = rope_tables(cfg, T, hd, model, x.device, layer)  # (T, hd) each
    q = apply_rope(q, cos, sin)  # (B, nh, T, hd)
    k = apply_rope(k, cos, sin)  # (B, nkv, T, hd)
    s("RoPE on Q and K", formula, q, note="K is rotated the same way", shown="Q")
    k, v = repeat_kv(k, v, nh, s)  # (B, nh, T, hd) each
    scalar = getattr(cfg, "query_pre_attn_scalar", None) or hd
    y = causal_attention(q, k, v, s, scale=scalar ** -0.5, window=sliding_window(cfg, layer),
                         softcap=getattr(cfg, "attn_logit_softcapping", None))  # (B, T, nh*hd)
    attn_out = linear(y, attn.o_proj)  # (B, T, C)
    s("o_proj (W_O)", "o = y · W_Oᵀ", attn_out, keep=True)
    if post_norms:
        attn_out = gemma_norm(attn_out, blk.post_attention_layernorm.weight, eps)  # (B, T, C)
        s("post_attention_layernorm", "attn_out = o / √(mean(o²) + ε) · (1 + γ)   (what the "
          "stream receives)", attn_out, keep=True)
    x = x + attn_out  # (B, T, C)
    s("residual add", "x = x + attn_out", x)

    s.section = "mlp"
    pre = blk.pre_feedforward_layernorm if post_norms else blk.post_attention_layernorm
    h = gemma_norm(x, pre.weight, eps)  # (B, T, C)
    s("pre_feedforward_layernorm" if post_norms else "post_attention_layernorm", NORM, h)
    act = getattr(cfg, "hidden_activation", None) or cfg.hidden_act
    mlp_out = gated_mlp(h, mlp, s, act=act)  # (B, T, C)
    if post_norms:
        mlp_out = gemma_norm(mlp_out, blk.post_feedforward_layernorm.weight, eps)  # (B, T, C)
        s("post_feedforward_layernorm", "mlp_out = m / √(mean(m²) + ε) · (1 + γ)   (what the "
          "stream receives)", mlp_out, keep=True)
    x = x + mlp_out  # (B, T, C)
    s("residual add", "x = x + mlp_out", x)
    return x


def final_norm(x: Any, norm: Any, cfg: Any, s: Steps) -> Any:
    h = gemma_norm(x, norm.weight, cfg.rms_norm_eps)  # (B, T, C)
    s("norm (final RMSNorm, 1 + γ)", NORM, h)
    return h
