"""One OLMo 2 block and the final RMSNorm, recomputed from the checkpoint's own weights.

What differs from Llama: no norm *before* attention or the MLP; instead their outputs are
normalised before the residual add (post_attention_layernorm, post_feedforward_layernorm), and
Q and K are each normalised over the whole projection (all heads at once) before RoPE.
"""

from __future__ import annotations

from typing import Any

import torch

from .attention import causal_attention, repeat_kv, sliding_window
from .llama import apply_rope, linear, rms_norm, rope_tables
from .steps import Steps


def block(x: Any, blk: Any, cfg: Any, layer: int, s: Steps, model: Any) -> Any:
    """x: (B, T, C), the residual stream entering block `layer`. Returns the stream leaving it."""
    B, T, C = x.shape
    nh = cfg.num_attention_heads
    nkv = getattr(cfg, "num_key_value_heads", None) or nh
    hd = getattr(cfg, "head_dim", None) or C // nh
    eps = cfg.rms_norm_eps
    attn, mlp = blk.self_attn, blk.mlp

    s.section = "attention"
    q = linear(x, attn.q_proj)  # (B, T, nh*hd)
    k = linear(x, attn.k_proj)  # (B, T, nkv*hd)
    v = linear(x, attn.v_proj)  # (B, T, nkv*hd)
    s("q_proj (no norm before it)", f"q = x · W_qᵀ   W_q is ({nh * hd}, {C})", q)
    s("k_proj", f"k = x · W_kᵀ   W_k is ({nkv * hd}, {C})", k,
      note=f"{nkv} key/value heads for {nh} query heads" if nkv != nh else None)
    s("v_proj", f"v = x · W_vᵀ   W_v is ({nkv * hd}, {C})", v)
    q = rms_norm(q, attn.q_norm.weight, eps)  # (B, T, nh*hd)
    k = rms_norm(k, attn.k_norm.weight, eps)  # (B, T, nkv*hd)
    s("q_norm, k_norm (RMSNorm over all heads)", f"q = q / √(mean(q²) + ε) · γ_q over its "
      f"{nh * hd} values; same for k", q, note="shown: Q")
    q = q.view(B, T, nh, hd).transpose(1, 2)  # (B, nh, T, hd)
    k = k.view(B, T, nkv, hd).transpose(1, 2)  # (B, nkv, T, hd)
    v = v.view(B, T, nkv, hd).transpose(1, 2)  # (B, nkv, T, hd)
    s("heads", f"q → (B, T, {nh}, {hd}) → transpose(1, 2); k, v → (B, {nkv}, T, {hd})", q)
    cos, sin, formula = rope_tables(cfg, T, hd, model, x.device, layer)  # (T, hd) each
    q = apply_rope(q, cos, sin)  # (B, nh, T, hd)
    k = apply_rope(k, cos, sin)  # (B, nkv, T, hd)
    s("RoPE on Q and K", formula, q, note="shown: Q; K is rotated the same way")
    k, v = repeat_kv(k, v, nh, s)  # (B, nh, T, hd) each
    y = causal_attention(q, k, v, s, window=sliding_window(cfg, layer))  # (B, T, nh*hd)
    o = linear(y, attn.o_proj)  # (B, T, C)
    s("o_proj (W_O)", "o = y · W_Oᵀ", o, keep=True)
    attn_out = rms_norm(o, blk.post_attention_layernorm.weight, eps)  # (B, T, C)
    s("post_attention_layernorm", "attn_out = o / √(mean(o²) + ε) · γ   (what the stream "
      "receives)", attn_out, keep=True)
    x = x + attn_out  # (B, T, C)
    s("residual add", "x = x + attn_out", x)

    s.section = "mlp"
    gate = linear(x, mlp.gate_proj)  # (B, T, I)
    up = linear(x, mlp.up_proj)  # (B, T, I)
    s("gate_proj (no norm before it)", f"g = x · W_gateᵀ   W_gate is ({gate.shape[-1]}, {C})",
      gate)
    s("up_proj", f"u = x · W_upᵀ   W_up is ({up.shape[-1]}, {C})", up)
    a = gate * torch.sigmoid(gate) * up  # (B, T, I)
    s("SiLU(gate) · up", "a = g · σ(g) · u   (SwiGLU)", a)
    m = linear(a, mlp.down_proj)  # (B, T, C)
    s("down_proj", f"m = a · W_downᵀ   W_down is ({C}, {a.shape[-1]})", m, keep=True)
    mlp_out = rms_norm(m, blk.post_feedforward_layernorm.weight, eps)  # (B, T, C)
    s("post_feedforward_layernorm", "mlp_out = m / √(mean(m²) + ε) · γ   (what the stream "
      "receives)", mlp_out, keep=True)
    x = x + mlp_out  # (B, T, C)
    s("residual add", "x = x + mlp_out", x)
    return x


def final_norm(x: Any, norm: Any, cfg: Any, s: Steps) -> Any:
    h = rms_norm(x, norm.weight, cfg.rms_norm_eps)  # (B, T, C)
    s("norm (final RMSNorm)", "h = x / √(mean(x²) + ε) · γ", h)
    return h
