"""Phi-3: Llama-like, with a fused qkv_proj and a fused gate_up_proj, partial rotary.

The block recomputation in the manner of nanoGPT: `qkv_proj` holds W_q, W_k and W_v one after
the other (nh·hd, then nkv·hd twice), and `gate_up_proj` holds W_gate then W_up. RoPE may rotate
only the first part of each head (`partial_rotary_factor`). The final norm is Llama's RMSNorm.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fptrace.families import Family, LlamaCppNames, Tap
from fptrace.families.llama import FAMILY as LLAMA
from fptrace.families.llama import LLAMA_LABELS, LLAMA_TAPS
from fptrace.families.llama import heads as llama_heads
from fptrace.families.ops import (
    RMS_FORMULA,
    Steps,
    causal_attention,
    linear,
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


def heads(qkv: torch.Tensor, attn: Any, cfg: PretrainedConfig, layer: int, s: Steps,
          model: nn.Module, fam: Family) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv (B, T, (nh + 2·nkv)·hd), the fused projection's output -> q (B, nh, T, hd), k and v
    (B, nkv, T, hd): split, then Llama's heads (RoPE on the first partial_rotary_factor of each
    head's values)."""
    dm = dims(cfg)  # the config's head counts and head width, normalised once
    nh, nkv, hd = dm.n_heads, dm.n_kv_heads, dm.head_dim
    q = qkv[..., : nh * hd]  # (B, T, nh*hd)
    k = qkv[..., nh * hd: (nh + nkv) * hd]  # (B, T, nkv*hd)
    v = qkv[..., (nh + nkv) * hd:]  # (B, T, nkv*hd)
    s("split → Q, K, V", f"q, k, v = qkv[…, :{nh * hd}], qkv[…, {nh * hd}:{(nh + nkv) * hd}], "
      f"qkv[…, {(nh + nkv) * hd}:]", q, shown="Q")
    return llama_heads(q, k, v, attn, cfg, layer, s, model, fam)


def block(x: torch.Tensor, blk: Any, cfg: PretrainedConfig, layer: int, s: Steps, model: nn.Module,
          fam: Family) -> torch.Tensor:
    """x: (B, T, C), the residual stream entering block `layer`. Returns the stream leaving it."""
    B, T, C = x.shape
    nh = dims(cfg).n_heads
    eps = cfg.rms_norm_eps
    attn, mlp = blk.self_attn, blk.mlp

    s.section = "attention"
    h = rms_norm(x, blk.input_layernorm.weight, eps)  # (B, T, C)
    s("input_layernorm (RMSNorm)", RMS_FORMULA, h, point=Point.ln1)
    qkv = linear(h, attn.qkv_proj)  # (B, T, (nh + 2·nkv)·hd)
    s("qkv_proj (fused)", f"qkv = h · W_qkvᵀ   W_qkv is ({qkv.shape[-1]}, {C})", qkv)
    q, k, v = heads(qkv, attn, cfg, layer, s, model, fam)  # (B,nh,T,hd), 2 × (B,nkv,T,hd)
    k, v = repeat_kv(k, v, nh, s)  # (B, nh, T, hd) each
    y = causal_attention(q, k, v, s, window=sliding_window(cfg, layer))  # (B, T, nh*hd)
    attn_out = linear(y, attn.o_proj)  # (B, T, C)
    s("o_proj (W_O)", "attn_out = y · W_Oᵀ", attn_out, keep=True, point=Point.attn_out)
    x = x + attn_out  # (B, T, C)
    s("residual add", "x = x + attn_out", x, point=Point.resid_mid)

    s.section = "mlp"
    h = rms_norm(x, blk.post_attention_layernorm.weight, eps)  # (B, T, C)
    s("post_attention_layernorm", RMS_FORMULA, h, point=Point.ln2)
    gu = linear(h, mlp.gate_up_proj)  # (B, T, 2I)
    s("gate_up_proj (fused)", f"gu = h · W_gate_upᵀ   W_gate_up is ({gu.shape[-1]}, {C})", gu)
    gate, up = gu.chunk(2, dim=-1)  # 2 × (B, T, I)
    a = up * (gate * gate.sigmoid())  # (B, T, I)
    s("SiLU(gate) · up", "g, u = gu's halves; a = u · g · σ(g)   (SwiGLU)", a,
      point=Point.mlp_act)
    mlp_out = linear(a, mlp.down_proj)  # (B, T, C)
    s("down_proj", f"mlp_out = a · W_downᵀ   W_down is ({C}, {a.shape[-1]})", mlp_out, keep=True,
      point=Point.mlp_out)
    x = x + mlp_out  # (B, T, C)
    s("residual add", "x = x + mlp_out", x, point=Point.resid_post)
    return x


def qk_weights(attn: Any, nh: int, nkv: int, hd: int
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """W_Q and W_K out of the fused qkv_proj ([W_q; W_k; W_v], ((nh + 2·nkv)·hd, C))."""
    W, b = attn.qkv_proj.weight, attn.qkv_proj.bias
    q, k = slice(0, nh * hd), slice(nh * hd, (nh + nkv) * hd)
    return W[q], None if b is None else b[q], W[k], None if b is None else b[k]


# llama.cpp's phi3 graph (checked on a tiny GGUF, tests/test_llamacpp_families.py): q, k and v
# are views of the fused `attn_qkv` product, rotated by halves as transformers' are (W_Q and W_K
# not permuted); the graph names q after RoPE `Qcur` and then, multiplied by 1/√head_dim before
# attention (whose own scale is then 1), `Qcur` again: the last is kept and scaled back. The
# stream between attention and the MLP is not named: `l_out`'s operand 0 is it, and that node's
# operand 0 the attention output. The MLP's gate and up are the halves of the fused `ffn_up`
# product (gate first, as transformers' chunk), SiLU(gate)·up is `ffn_swiglu`.
LLAMACPP_NAMES = LlamaCppNames(
    archs=("phi3",), q_scaled=True,
    operands={"ffn_inp": ("l_out", 0), "attn_out": ("l_out", 0, 0)},
    parts={Point.mlp_gate: ("ffn_up", 0, 2), Point.mlp_up: ("ffn_up", 1, 2)},
    points={Point.embed: "embd", Point.ln1: "attn_norm", Point.q: "Qcur", Point.k: "Kcur",
            Point.v: "Vcur", Point.z: "kqv_out", Point.attn_out: "attn_out",
            Point.resid_mid: "ffn_inp", Point.ln2: "ffn_norm", Point.mlp_act: "ffn_swiglu",
            Point.mlp_out: "ffn_out", Point.resid_post: "l_out",
            Point.final_norm: "result_norm", Point.logits: "result_output"},
    weights={"self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
             "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"})

FAMILY = replace(
    LLAMA, name="phi3", title="Phi-3", model_types=("phi3",), recompute_block=block,
    qk_weights=qk_weights,
    labels={**LLAMA_LABELS, "qkv_proj": "fused QKV projection",
            "gate_up_proj": "MLP gate+up (fused)"},
    taps={**LLAMA_TAPS, Point.mlp_gate: Tap("mlp.gate_up_proj", part=(0, 2)),
          Point.mlp_up: Tap("mlp.gate_up_proj", part=(1, 2))},
    head_taps=("self_attn.qkv_proj",), heads=heads, llamacpp_names=LLAMACPP_NAMES,
    tiny=dict(model_type="phi3", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
              num_attention_heads=4, num_key_value_heads=4, vocab_size=1000,
              max_position_embeddings=64, pad_token_id=0),
)
