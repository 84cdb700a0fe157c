"""Llama (and SmolLM): RMSNorm, RoPE, grouped-query attention, SwiGLU MLP.

The block recomputation below is the one Mistral, Qwen2 and Qwen3 use too (their families are
this record with a few facts changed): straight-line code in the manner of nanoGPT, B batch,
T positions, C = hidden_size, nh query heads and nkv key/value heads of hd values each. `heads`,
from the projections' outputs to the heads attention reads, serves every Llama-like family
(Gemma, OLMo 2, Phi-3 too), and `diff --deep` runs it on each side's own projections.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fptrace.families import Family, LlamaCppNames, Tap
from fptrace.families.kinds import MlpKind, NormKind, PositionKind, QkNorm
from fptrace.families.ops import (
    RMS_FORMULA,
    Steps,
    apply_rope,
    causal_attention,
    gated_mlp,
    linear,
    moe_mlp,
    project_qkv,
    repeat_kv,
    rms_norm,
    rope_tables,
    rotary_dims,
    sliding_window,
    split_heads,
)
from fptrace.families.parts import dims
from fptrace.points import Point

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig


def heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn: Any, cfg: PretrainedConfig,
          layer: int, s: Steps, model: nn.Module, fam: Family
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, T, nh*hd), k and v (B, T, nkv*hd), the projections' outputs -> the heads attention
    reads: q (B, nh, T, hd), k and v (B, nkv, T, hd), q and k normalised where the family says
    (over the whole projection, OLMo 2; per head, Qwen3 and Gemma 3) and rotated (the first
    partial_rotary_factor of each head's values, Phi-3)."""
    B, T, _ = q.shape
    dm = dims(cfg)  # the config's head counts and head width, normalised once
    nh, nkv, hd = dm.n_heads, dm.n_kv_heads, dm.head_dim
    eps = cfg.rms_norm_eps
    one_plus = fam.norm_type.one_plus
    if fam.qk_norm is QkNorm.whole:  # OLMo 2: one RMSNorm over all heads of Q, one of K
        q = rms_norm(q, attn.q_norm.weight, eps)  # (B, T, nh*hd)
        k = rms_norm(k, attn.k_norm.weight, eps)  # (B, T, nkv*hd)
        s("q_norm, k_norm (RMSNorm over all heads)", f"q = q / √(mean(q²) + ε) · γ_q over its "
          f"{nh * hd} values; same for k", q, shown="Q")
    q, k, v = split_heads(q, k, v, nh, nkv, hd, s)  # (B, nh, T, hd), 2 × (B, nkv, T, hd)
    if fam.qk_norm is QkNorm.per_head:  # Qwen3, Gemma 3: an RMSNorm on each head of Q and K
        q = rms_norm(q, attn.q_norm.weight, eps, one_plus)  # (B, nh, T, hd)
        k = rms_norm(k, attn.k_norm.weight, eps, one_plus)  # (B, nkv, T, hd)
        if one_plus:
            s("q_norm, k_norm (per head, 1 + γ)", f"q = q / √(mean(q²) + ε) · (1 + γ_q) over "
              f"each head's {hd} values; same for k", q, shown="Q")
        else:
            s("q_norm, k_norm (RMSNorm per head)", "q = q / √(mean(q²) + ε) · γ_q over each "
              f"head's {hd} values; same for k with γ_k", q, shown="Q")
    rot = rotary_dims(cfg, hd)
    cos, sin, formula = rope_tables(cfg, T, rot, model, q.device, layer)  # (T, rot) each
    q = apply_rope(q, cos, sin)  # (B, nh, T, hd)
    k = apply_rope(k, cos, sin)  # (B, nkv, T, hd)
    s("RoPE on Q and K", (f"the first {rot} of {hd} values per head: " if rot < hd else "")
      + formula, q, note="K is rotated the same way", shown="Q", point=Point.q)
    return q, k, v


def block(x: torch.Tensor, blk: Any, cfg: PretrainedConfig, layer: int, s: Steps, model: nn.Module,
          fam: Family) -> torch.Tensor:
    """x: (B, T, C), the residual stream entering block `layer`. Returns the stream leaving it."""
    B, T, C = x.shape
    dm = dims(cfg)  # the config's head counts and head width, normalised once
    nh, nkv, hd = dm.n_heads, dm.n_kv_heads, dm.head_dim
    eps = cfg.rms_norm_eps
    attn, mlp = blk.self_attn, blk.mlp

    s.section = "attention"
    h = rms_norm(x, blk.input_layernorm.weight, eps)  # (B, T, C)
    s("input_layernorm (RMSNorm)", RMS_FORMULA, h, point=Point.ln1)
    q, k, v = project_qkv(h, attn, nh, nkv, hd, s)  # (B, T, nh*hd), 2 × (B, T, nkv*hd)
    q, k, v = heads(q, k, v, attn, cfg, layer, s, model, fam)  # (B,nh,T,hd), 2 × (B,nkv,T,hd)
    k, v = repeat_kv(k, v, nh, s)  # (B, nh, T, hd) each
    sinks = attn.get_parameter(fam.attn_sinks) if fam.attn_sinks else None  # (nh,): gpt-oss
    y = causal_attention(q, k, v, s, window=sliding_window(cfg, layer),
                         sinks=sinks)  # (B, T, nh*hd)
    attn_out = linear(y, attn.o_proj)  # (B, T, C)
    s("o_proj (W_O)", "attn_out = y · W_Oᵀ" + (" + b" if attn.o_proj.bias is not None else ""),
      attn_out, keep=True, point=Point.attn_out)
    x = x + attn_out  # (B, T, C)
    s("residual add", "x = x + attn_out", x, point=Point.resid_mid)

    s.section = "mlp"
    h = rms_norm(x, blk.post_attention_layernorm.weight, eps)  # (B, T, C)
    s("post_attention_layernorm", RMS_FORMULA, h, point=Point.ln2)
    moe = fam.moe(cfg) if fam.moe else None
    if moe is not None and hasattr(mlp, fam.router):  # an MoE block (Mixtral, Qwen-MoE, OLMoE)
        mlp_out = moe_mlp(h, mlp, moe, s, fam)  # (B, T, C)
    else:
        mlp_out = gated_mlp(h, mlp, s)  # (B, T, C)
    x = x + mlp_out  # (B, T, C)
    s("residual add", "x = x + mlp_out", x, point=Point.resid_post)
    return x


def final_norm(x: torch.Tensor, norm: Any, cfg: PretrainedConfig, s: Steps) -> torch.Tensor:
    h = rms_norm(x, norm.weight, cfg.rms_norm_eps)  # (B, T, C)
    s("norm (final RMSNorm)", RMS_FORMULA, h, point=Point.final_norm)
    return h


def qk_weights(attn: Any, nh: int, nkv: int, hd: int
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """W_Q, b_Q, W_K, b_K of q_proj and k_proj (biases: Qwen2; None where there are none)."""
    return attn.q_proj.weight, attn.q_proj.bias, attn.k_proj.weight, attn.k_proj.bias


# the names every Llama-like block uses (Mistral, Qwen2/3, Phi-3, Gemma, OLMo 2 share them)
LLAMA_LABELS = {"input_layernorm": "norm before attention",
                "post_attention_layernorm": "norm before the MLP"}

# where a Llama-like block shows its points (the post-norms come from attn_added/mlp_added)
LLAMA_TAPS = {
    Point.ln1: Tap("input_layernorm"),
    Point.z: Tap("self_attn.o_proj", "in"), Point.attn_out: Tap("self_attn.o_proj"),
    Point.resid_mid: Tap("post_attention_layernorm", "in"),
    Point.ln2: Tap("post_attention_layernorm"),
    Point.mlp_gate: Tap("mlp.gate_proj"), Point.mlp_up: Tap("mlp.up_proj"),
    Point.mlp_act: Tap("mlp.down_proj", "in"), Point.mlp_out: Tap("mlp.down_proj"),
}

# the names llama.cpp's graph gives these points (llm_build_llama), checked on SmolLM2's GGUF
LLAMACPP_NAMES = LlamaCppNames(
    archs=("llama",), rope_adjacent=True,
    points={Point.embed: "embd", Point.ln1: "attn_norm", Point.q: "Qcur", Point.k: "Kcur",
            Point.v: "Vcur", Point.z: "kqv_out", Point.attn_out: "attn_out",
            Point.resid_mid: "ffn_inp", Point.ln2: "ffn_norm", Point.mlp_gate: "ffn_gate",
            Point.mlp_up: "ffn_up", Point.mlp_act: "ffn_swiglu", Point.mlp_out: "ffn_out",
            Point.resid_post: "l_out", Point.final_norm: "result_norm",
            Point.logits: "result_output"},
    weights={"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"})

FAMILY = Family(
    name="llama", title="Llama", model_types=("llama",),
    blocks="model.layers", embed="model.embed_tokens", final_norm="model.norm",
    lm_head="lm_head", attn="self_attn", mlp="mlp",
    norm_type=NormKind.rmsnorm, mlp_type=MlpKind.swiglu, positions=PositionKind.rope,
    recompute_block=block, recompute_final_norm=final_norm,
    labels=LLAMA_LABELS, attn_norm="input_layernorm", qk_weights=qk_weights, taps=LLAMA_TAPS,
    head_taps=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), heads=heads,
    llamacpp_names=LLAMACPP_NAMES,
    tiny=dict(model_type="llama", num_hidden_layers=3, hidden_size=64, intermediate_size=96,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
              max_position_embeddings=64, tie_word_embeddings=False),
)
