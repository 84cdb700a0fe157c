"""One Llama-family block (Llama, Mistral, Qwen2, SmolLM) and the final RMSNorm, recomputed
from the checkpoint's own weights.

Straight-line code in the manner of nanoGPT: B batch, T positions, C = hidden_size, nh query
heads and nkv key/value heads of hd values each. nn.Linear stores (out, in), so a projection is
`x @ W.T` (+ b where the checkpoint has one: Qwen2's q/k/v). Each `s(...)` records a tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from .attention import causal_attention, repeat_kv, sliding_window
from ..families.parts import dims
from .steps import Steps


def rms_norm(x: Any, weight: Any, eps: float) -> Any:
    rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)  # (B, T, 1)
    return x / rms * weight  # (B, T, C)


def linear(x: Any, proj: Any) -> Any:
    y = x @ proj.weight.T  # (B, T, out)
    return y if proj.bias is None else y + proj.bias


def rotate_half(t: Any) -> Any:
    half = t.shape[-1] // 2
    return torch.cat((-t[..., half:], t[..., :half]), dim=-1)  # (..., hd)


def apply_rope(t: Any, cos: Any, sin: Any) -> Any:
    """Rotate the first cos.shape[-1] values of each head of t (all of them unless the family
    uses partial rotary); the rest pass unchanged."""
    rot = cos.shape[-1]
    r = t[..., :rot]  # (B, heads, T, rot)
    return torch.cat((r * cos + rotate_half(r) * sin, t[..., rot:]), dim=-1)  # (B, heads, T, hd)


def rope_tables(cfg: Any, T: int, hd: int, model: Any, device: Any,
                layer: int | None = None) -> tuple[Any, Any, str]:
    """cos and sin, (T, hd) each, for positions 0..T-1; plus the formula shown. A config whose
    RoPE parameters differ by layer type (Gemma 3: local and global bases) gives block
    `layer` the parameters of its type."""
    params = getattr(cfg, "rope_parameters", None) or {}
    layer_types = getattr(cfg, "layer_types", None)
    prefix = ""
    if layer_types and layer is not None and layer_types[layer] in params:
        prefix = f"{layer_types[layer]}_"
        params = params[layer_types[layer]] or {}
    rope_type = params.get("rope_type", "default")
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    if rope_type == "default":
        inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, device=device).float() / hd))  # (hd/2,)
        scaling = 1.0
        formula = f"θ_i = {theta:g}^(−2i/{hd}); q' = q·cos(pθ) + rotate_half(q)·sin(pθ), same for k"
    else:  # scaled RoPE (llama3, yarn, ...): the frequencies the model itself computed
        rotary = next(m for name, m in model.named_modules() if name.endswith("rotary_emb"))
        inv_freq = getattr(rotary, f"{prefix}inv_freq").float().to(device)  # (hd/2,)
        scaling = float(getattr(rotary, f"{prefix}attention_scaling"))
        formula = (f"{rope_type} RoPE, θ_i from the model's rotary buffer; "
                   "q' = q·cos(pθ) + rotate_half(q)·sin(pθ), same for k")
    pos = torch.arange(T, device=device).float()  # (T,)
    angles = pos[:, None] * inv_freq[None, :]  # (T, hd/2)
    emb = torch.cat((angles, angles), dim=-1)  # (T, hd)
    return emb.cos() * scaling, emb.sin() * scaling, formula


def project_qkv(h: Any, attn: Any, nh: int, nkv: int, hd: int, s: Steps, src: str = "h"
                ) -> tuple[Any, Any, Any]:
    """q_proj, k_proj, v_proj of h (B, T, C), each recorded: q (B, T, nh*hd), k, v
    (B, T, nkv*hd)."""
    C = h.shape[-1]
    q = linear(h, attn.q_proj)  # (B, T, nh*hd)
    k = linear(h, attn.k_proj)  # (B, T, nkv*hd)
    v = linear(h, attn.v_proj)  # (B, T, nkv*hd)
    bias = " + b" if attn.q_proj.bias is not None else ""
    s("q_proj", f"q = {src} · W_qᵀ{bias}   W_q is ({nh * hd}, {C})", q)
    s("k_proj", f"k = {src} · W_kᵀ{bias}   W_k is ({nkv * hd}, {C})", k,
      note=f"{nkv} key/value heads for {nh} query heads" if nkv != nh else None)
    s("v_proj", f"v = {src} · W_vᵀ{bias}   W_v is ({nkv * hd}, {C})", v)
    return q, k, v


def split_heads(q: Any, k: Any, v: Any, nh: int, nkv: int, hd: int, s: Steps
                ) -> tuple[Any, Any, Any]:
    """(B, T, heads*hd) -> (B, heads, T, hd) for q (nh heads), k and v (nkv heads)."""
    B, T, _ = q.shape
    q = q.view(B, T, nh, hd).transpose(1, 2)  # (B, nh, T, hd)
    k = k.view(B, T, nkv, hd).transpose(1, 2)  # (B, nkv, T, hd)
    v = v.view(B, T, nkv, hd).transpose(1, 2)  # (B, nkv, T, hd)
    s("heads", f"q → (B, T, {nh}, {hd}) → transpose(1, 2); k, v → (B, {nkv}, T, {hd})", q,
      shown="Q")
    return q, k, v


def gated_mlp(h: Any, mlp: Any, s: Steps, act: str = "silu", src: str = "h") -> Any:
    """down(act(gate(h)) · up(h)): SwiGLU (act "silu") or GeGLU (a GELU name). (B, T, C)."""
    C = h.shape[-1]
    gate = linear(h, mlp.gate_proj)  # (B, T, I)
    up = linear(h, mlp.up_proj)  # (B, T, I)
    s("gate_proj", f"g = {src} · W_gateᵀ   W_gate is ({gate.shape[-1]}, {C})", gate)
    s("up_proj", f"u = {src} · W_upᵀ   W_up is ({up.shape[-1]}, {C})", up)
    if act == "silu":
        a = gate * torch.sigmoid(gate) * up  # (B, T, I)
        s("SiLU(gate) · up", "a = g · σ(g) · u   (SwiGLU)", a)
    else:
        from .gpt2 import gelu

        g, formula = gelu(gate, act)  # (B, T, I)
        a = g * up  # (B, T, I)
        s("GELU(gate) · up", "a = GELU(g) · u   (GeGLU)", a, note=f"{formula}, applied to g")
    m = linear(a, mlp.down_proj)  # (B, T, C)
    s("down_proj", f"m = a · W_downᵀ   W_down is ({C}, {a.shape[-1]})", m, keep=True)
    return m


def block(x: Any, blk: Any, cfg: Any, layer: int, s: Steps, model: Any) -> Any:
    """x: (B, T, C), the residual stream entering block `layer`. Returns the stream leaving it."""
    B, T, C = x.shape
    dm = dims(cfg)  # the config's head counts and head width, normalised once
    nh, nkv, hd = dm.n_heads, dm.n_kv_heads, dm.head_dim
    eps = cfg.rms_norm_eps
    attn, mlp = blk.self_attn, blk.mlp

    s.section = "attention"
    h = rms_norm(x, blk.input_layernorm.weight, eps)  # (B, T, C)
    s("input_layernorm (RMSNorm)", "h = x / √(mean(x²) + ε) · γ", h)
    q, k, v = project_qkv(h, attn, nh, nkv, hd, s)  # (B, T, nh*hd), 2 × (B, T, nkv*hd)
    q, k, v = split_heads(q, k, v, nh, nkv, hd, s)  # (B, nh, T, hd), 2 × (B, nkv, T, hd)
    if getattr(attn, "q_norm", None) is not None:  # Qwen3: an RMSNorm on each head of Q and K
        q = rms_norm(q, attn.q_norm.weight, eps)  # (B, nh, T, hd)
        k = rms_norm(k, attn.k_norm.weight, eps)  # (B, nkv, T, hd)
        s("q_norm, k_norm (RMSNorm per head)", "q = q / √(mean(q²) + ε) · γ_q over each head's "
          f"{hd} values; same for k with γ_k", q, shown="Q")
    cos, sin, formula = rope_tables(cfg, T, hd, model, x.device, layer)  # (T, hd) each
    q = apply_rope(q, cos, sin)  # (B, nh, T, hd)
    k = apply_rope(k, cos, sin)  # (B, nkv, T, hd)
    s("RoPE on Q and K", formula, q, note="K is rotated the same way", shown="Q")
    k, v = repeat_kv(k, v, nh, s)  # (B, nh, T, hd) each
    y = causal_attention(q, k, v, s, window=sliding_window(cfg, layer))  # (B, T, nh*hd)
    attn_out = linear(y, attn.o_proj)  # (B, T, C)
    s("o_proj (W_O)", "attn_out = y · W_Oᵀ", attn_out, keep=True)
    x = x + attn_out  # (B, T, C)
    s("residual add", "x = x + attn_out", x)

    s.section = "mlp"
    h = rms_norm(x, blk.post_attention_layernorm.weight, eps)  # (B, T, C)
    s("post_attention_layernorm", "h = x / √(mean(x²) + ε) · γ", h)
    mlp_out = gated_mlp(h, mlp, s)  # (B, T, C)
    x = x + mlp_out  # (B, T, C)
    s("residual add", "x = x + mlp_out", x)
    return x


def final_norm(x: Any, norm: Any, cfg: Any, s: Steps) -> Any:
    h = rms_norm(x, norm.weight, cfg.rms_norm_eps)  # (B, T, C)
    s("norm (final RMSNorm)", "h = x / √(mean(x²) + ε) · γ", h)
    return h
