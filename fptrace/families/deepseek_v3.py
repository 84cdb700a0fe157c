"""DeepSeek-V3: multi-head latent attention (Q and K/V through low-rank latents, part of
each head rotated, part not) and, after first_k_dense_replace dense blocks, a mixture of
n_routed_experts experts plus n_shared_experts shared ones. Its router scores each expert with
a sigmoid; the choice adds a learned correction bias (e_score_correction_bias) and keeps only
the topk_group best of n_group groups of experts (a group's worth: the sum of its two best
scores); the weights are the chosen experts' uncorrected scores, renormalised when
norm_topk_prob says so, times routed_scaling_factor.

explain recomputes its blocks below (latent attention, then the dense MLP or the mixture);
`diff --deep` compares the points its modules show (q, k and v after RoPE show in none)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fptrace.errors import ModelLoadError
from fptrace.families import (
    GGUF_LLAMA_CONFIG,
    GGUF_LLAMA_TENSORS,
    Family,
    GGUFWeights,
    LlamaCppNames,
    Moe,
    Tap,
    gguf_block_tensors,
    gguf_number,
)
from fptrace.families.kinds import Scoring
from fptrace.families.llama import final_norm
from fptrace.families.mixtral import FAMILY as MIXTRAL
from fptrace.families.ops import (
    RMS_FORMULA,
    Steps,
    apply_rope,
    causal_attention,
    gated_mlp,
    linear,
    moe_mlp,
    rms_norm,
    rope_tables,
)
from fptrace.points import Point

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig


def moe(cfg: PretrainedConfig) -> Moe | None:
    n = getattr(cfg, "n_routed_experts", 0)
    if not n:
        return None
    return Moe(n_experts=int(n), top_k=int(cfg.num_experts_per_tok),
               d_expert=int(cfg.moe_intermediate_size), n_shared=int(cfg.n_shared_experts or 0),
               d_shared=int(cfg.moe_intermediate_size) * int(cfg.n_shared_experts or 0),
               scoring=Scoring.sigmoid, renormalise=bool(cfg.norm_topk_prob),
               scale=float(cfg.routed_scaling_factor), n_groups=int(cfg.n_group or 1),
               topk_groups=int(cfg.topk_group or 1), score_bias=True)


def d_expert(cfg: PretrainedConfig) -> int | None:
    return getattr(cfg, "moe_intermediate_size", None)


def _rope_interleaved(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """DeepSeek's RoPE on interleaved pairs (t0, t1), (t2, t3), ... each turned by one angle;
    the result is laid out as the rotated evens, then the rotated odds (as transformers')."""
    import torch

    half = cos.shape[-1] // 2
    c, sn = cos[:, :half], sin[:, :half]  # (T, r/2): one angle a pair
    a, b = t[..., 0::2], t[..., 1::2]  # (B, heads, T, r/2) each
    return torch.cat([a * c - b * sn, b * c + a * sn], dim=-1)  # (B, heads, T, r)


def heads(q: torch.Tensor, ckv: torch.Tensor, kv: torch.Tensor, attn: Any, cfg: PretrainedConfig,
          layer: int, s: Steps, model: nn.Module, fam: Family
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The outputs of q_b_proj (B, T, nh·(nope+rd)), kv_a_proj_with_mqa (B, T, r+rd) and
    kv_b_proj (B, T, nh·(nope+vd)) -> the heads attention reads: q and k (B, nh, T, nope+rd),
    their rope parts rotated (the key's shared by all heads), v (B, nh, T, vd)."""
    import torch

    B, T, _ = q.shape
    nh = cfg.num_attention_heads
    nope, rd, vd = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    q = q.view(B, T, nh, nope + rd).transpose(1, 2)  # (B, nh, T, nope+rd)
    q_pass, q_rot = q.split([nope, rd], dim=-1)  # (B, nh, T, nope), (B, nh, T, rd)
    k_rot = ckv[..., -rd:].reshape(B, 1, T, rd)  # (B, 1, T, rd)
    cos, sin, formula = rope_tables(cfg, T, rd, model, q.device, layer)  # (T, rd) each
    if getattr(cfg, "rope_interleave", False):
        q_rot, k_rot = _rope_interleaved(q_rot, cos, sin), _rope_interleaved(k_rot, cos, sin)
        formula += "; on interleaved pairs"
    else:
        q_rot, k_rot = apply_rope(q_rot, cos, sin), apply_rope(k_rot, cos, sin)
    kv = kv.view(B, T, nh, nope + vd).transpose(1, 2)  # (B, nh, T, nope+vd)
    k_pass, v = kv.split([nope, vd], dim=-1)  # (B, nh, T, nope), (B, nh, T, vd)
    q = torch.cat([q_pass, q_rot], dim=-1)  # (B, nh, T, nope+rd)
    k = torch.cat([k_pass, k_rot.expand(B, nh, T, rd)], dim=-1)  # (B, nh, T, nope+rd)
    s("heads, RoPE on the rope parts", f"q = [q_nope, RoPE(q_rope)], k = [k_nope, RoPE(k_rope) "
      f"shared by all heads], {nope} + {rd} values a head; " + formula, q, shown="Q",
      point=Point.q)
    return q, k, v


def block(x: torch.Tensor, blk: Any, cfg: PretrainedConfig, layer: int, s: Steps, model: nn.Module,
          fam: Family) -> torch.Tensor:
    """x: (B, T, C), the stream entering block `layer`. Latent attention: Q through its latent
    (q_a_proj, a norm, q_b_proj), K and V from one shared latent (kv_a_proj_with_mqa, a norm,
    kv_b_proj) plus a RoPE key every head shares; each head's query and key are a part without
    positions (nope) and a rotated part (rope). Then the dense MLP, or the experts."""
    B, T, C = x.shape
    nh = cfg.num_attention_heads
    nope, rd, vd, r = (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim,
                       cfg.kv_lora_rank)
    eps = cfg.rms_norm_eps
    attn, mlp = blk.self_attn, blk.mlp

    s.section = "attention"
    h = rms_norm(x, blk.input_layernorm.weight, eps)  # (B, T, C)
    s("input_layernorm (RMSNorm)", RMS_FORMULA, h, point=Point.ln1)
    if attn.q_a_proj is not None:  # Q through a latent of q_lora_rank values
        cq = linear(h, attn.q_a_proj)  # (B, T, q_lora_rank)
        s("q_a_proj (Q latent)", f"c_q = h · W_qaᵀ   W_qa is ({cq.shape[-1]}, {C})", cq)
        cq = rms_norm(cq, attn.q_a_layernorm.weight, attn.q_a_layernorm.variance_epsilon)
        s("q_a_layernorm", "c_q = RMSNorm(c_q)", cq)
        q = linear(cq, attn.q_b_proj)  # (B, T, nh*(nope+rd))
        s("q_b_proj", f"q = c_q · W_qbᵀ   {nh} heads of {nope} + {rd}", q)
    else:
        q = linear(h, attn.q_proj)  # (B, T, nh*(nope+rd))
        s("q_proj", f"q = h · W_qᵀ   {nh} heads of {nope} + {rd}", q)
    ckv = linear(h, attn.kv_a_proj_with_mqa)  # (B, T, r+rd)
    s("kv_a_proj_with_mqa", f"[c_kv, k_rope] = h · W_kvaᵀ   a latent of {r} and one RoPE key "
      f"of {rd} all heads share", ckv)
    c_kv = rms_norm(ckv[..., :r], attn.kv_a_layernorm.weight,
                    attn.kv_a_layernorm.variance_epsilon)  # (B, T, r)
    s("kv_a_layernorm", "c_kv = RMSNorm(c_kv)   (what the KV cache keeps, with k_rope)", c_kv)
    kv = linear(c_kv, attn.kv_b_proj)  # (B, T, nh*(nope+vd))
    s("kv_b_proj", f"[k_nope, v] = c_kv · W_kvbᵀ   {nh} heads of {nope} + {vd}", kv)
    q, k, v = heads(q, ckv, kv, attn, cfg, layer, s, model, fam)  # (B,nh,T,·) each
    y = causal_attention(q, k, v, s, scale=float(attn.scaling))  # (B, T, nh*vd)
    attn_out = linear(y, attn.o_proj)  # (B, T, C)
    s("o_proj (W_O)", f"attn_out = y · W_Oᵀ   W_O is ({C}, {nh * vd})", attn_out, keep=True,
      point=Point.attn_out)
    x = x + attn_out  # (B, T, C)
    s("residual add", "x = x + attn_out", x, point=Point.resid_mid)

    s.section = "mlp"
    h = rms_norm(x, blk.post_attention_layernorm.weight, eps)  # (B, T, C)
    s("post_attention_layernorm", RMS_FORMULA, h, point=Point.ln2)
    moe = fam.moe(cfg) if fam.moe is not None else None
    if moe is not None and hasattr(mlp, fam.router):  # blocks from first_k_dense_replace on
        mlp_out = moe_mlp(h, mlp, moe, s, fam)  # (B, T, C)
    else:  # the first blocks: a dense SwiGLU MLP
        mlp_out = gated_mlp(h, mlp, s, inner_points=False)  # (B, T, C)
    x = x + mlp_out  # (B, T, C)
    s("residual add", "x = x + mlp_out", x, point=Point.resid_post)
    return x


def kv_cache_values(cfg: PretrainedConfig) -> int:
    """MLA caches, per block and token, the K/V latent and the one RoPE key all heads share."""
    return int(cfg.kv_lora_rank) + int(cfg.qk_rope_head_dim)


# MLA has no q_proj/k_proj of the usual shapes: the points a Llama-like block shows outside them
MLA_TAPS = {
    Point.ln1: Tap("input_layernorm"),
    Point.z: Tap("self_attn.o_proj", "in"), Point.attn_out: Tap("self_attn.o_proj"),
    Point.resid_mid: Tap("post_attention_layernorm", "in"),
    Point.ln2: Tap("post_attention_layernorm"), Point.mlp_out: Tap("mlp"),
}

# llama.cpp's deepseek2 graph (checked on a tiny GGUF, tests/test_llamacpp_families.py): its
# latent attention absorbs each head's no-position key into the query (`q_nope_absorbed`) and
# attends over the latent itself (`Kcur`: the latent and the shared RoPE key, one head;
# `kqv_mla` the heads' values from it), so q, k and v are never formed as transformers forms
# them and are not compared (transformers' modules show them in none either); the heads'
# output before the output projection is `kqv_out` (z), the projection's output is unnamed:
# `ffn_inp`'s operand 0. The MLP's output, what the stream receives, is `ffn_out` in every
# block (the dense ones', and the routed experts' sum plus the shared experts' in the others);
# the router's logits `ffn_moe_logits` (the sigmoid and the correction bias come after), the
# experts chosen `ffn_moe_topk` and their weights, renormalised and scaled,
# `ffn_moe_weights_scaled`. In MoE blocks `ffn_gate`, `ffn_up`, `ffn_swiglu` are the shared
# experts': not mapped.
LLAMACPP_NAMES = LlamaCppNames(
    archs=("deepseek2",),
    points={Point.embed: "embd", Point.ln1: "attn_norm", Point.z: "kqv_out",
            Point.attn_out: "attn_out",
            Point.resid_mid: "ffn_inp", Point.ln2: "ffn_norm", Point.mlp_out: "ffn_out",
            Point.resid_post: "l_out", Point.final_norm: "result_norm",
            Point.logits: "result_output"},
    operands={"attn_out": ("ffn_inp", 0)},
    routing=("ffn_moe_logits", "ffn_moe_topk", "ffn_moe_weights_scaled"),
    no_emulation="DeepSeek's latent attention absorbs each head's key into the query in "
                 "llama.cpp's graph, which the attn and act-q8 steps do not compute")


def q_latent(hparam: Callable[[str], object]) -> int:
    """The Q latent's width; a file without one (DeepSeek-V2-Lite's plain attn_q) is refused."""
    rank = hparam("attention.q_lora_rank")
    if not isinstance(rank, int) or not rank:
        raise ModelLoadError("a deepseek2 GGUF file without a Q latent (no "
                             "deepseek2.attention.q_lora_rank): fptrace's reader reads "
                             "DeepSeek-V3's latent attention only")
    return rank


def sigmoid_gating(hparam: Callable[[str], object]) -> float:
    """The routed experts' scale, where the file's gating is DeepSeek-V3's sigmoid (2); the
    softmax of DeepSeek-V2's files (1, or no key) is another router: refused."""
    gating = hparam("expert_gating_func")
    if gating != 2:
        raise ModelLoadError(f"a deepseek2 GGUF file whose experts' gating is {gating!r} "
                             "(deepseek2.expert_gating_func): fptrace's reader reads "
                             "DeepSeek-V3's sigmoid gating (2) only")
    return gguf_number(hparam("expert_weights_scale"), 1.0)


def nope_width(hparam: Callable[[str], object]) -> int | None:
    """Each head's key width without positions: its whole key less the rotated part."""
    whole, rotated = hparam("attention.key_length_mla"), hparam("rope.dimension_count")
    return whole - rotated if isinstance(whole, int) and isinstance(rotated, int) else None


def rope_parameters(hparam: Callable[[str], object]) -> dict:
    """DeepSeek's RoPE: YaRN where the file says so (the published files do), its attention
    scale from `rope.scaling.yarn_log_multiplier` (0.1 · mscale_all_dim, as the converter
    writes it; DeepSeek's configs give mscale the same value); plain RoPE without the keys."""
    theta = gguf_number(hparam("rope.freq_base"), 10000.0)
    kind, factor = hparam("rope.scaling.type"), hparam("rope.scaling.factor")
    if kind is None:
        return {"rope_type": "default", "rope_theta": theta}
    if kind != "yarn" or not isinstance(factor, (int, float)):
        raise ModelLoadError(f"a deepseek2 GGUF file with the RoPE scaling {kind!r} (factor "
                             f"{factor!r}): fptrace's reader reads DeepSeek's YaRN only")
    mscale = gguf_number(hparam("rope.scaling.yarn_log_multiplier"), 0.0) / 0.1
    return {"rope_type": "yarn", "rope_theta": theta, "factor": float(factor),
            "original_max_position_embeddings": int(gguf_number(
                hparam("rope.scaling.original_context_length"), 4096)),
            "beta_fast": gguf_number(hparam("rope.scaling.yarn_beta_fast"), 32.0),
            "beta_slow": gguf_number(hparam("rope.scaling.yarn_beta_slow"), 1.0),
            "mscale": mscale, "mscale_all_dim": mscale}


# how fptrace reads a deepseek2 GGUF (transformers' GGUF loader reads none) as
# DeepseekV3ForCausalLM: the names of llama.cpp's converter; kv_b_proj, which the converter
# splits into attn_k_b (each head's key part, transposed) and attn_v_b, joined back; one K/V
# head in the file (the latent is shared) but every head its own key and value in
# transformers; the dense lead blocks, the shared experts, the correction bias exp_probs_b;
# YaRN with its attention scale (rope_parameters); a window and llama.cpp's own YaRN factors
# are not read: refused
GGUF_WEIGHTS = GGUFWeights(
    arch="deepseek2", model_type="deepseek_v3",
    config=GGUF_LLAMA_CONFIG | {
        "num_key_value_heads": "attention.head_count",
        "intermediate_size": "feed_forward_length",
        "moe_intermediate_size": "expert_feed_forward_length",
        "n_routed_experts": "expert_count", "num_experts_per_tok": "expert_used_count",
        "n_shared_experts": "expert_shared_count", "routed_scaling_factor": sigmoid_gating,
        "norm_topk_prob": lambda hparam: bool(hparam("expert_weights_norm")),
        "n_group": lambda hparam: hparam("expert_group_count") or 1,
        "topk_group": lambda hparam: hparam("expert_group_used_count") or 1,
        "first_k_dense_replace": "leading_dense_block_count",
        "q_lora_rank": q_latent, "kv_lora_rank": "attention.kv_lora_rank",
        "qk_rope_head_dim": "rope.dimension_count", "qk_nope_head_dim": nope_width,
        "v_head_dim": "attention.value_length_mla", "rope_interleave": True,
        "rope_parameters": rope_parameters},
    tensors=GGUF_LLAMA_TENSORS | {
        "model.layers.{i}.self_attn.kv_b_proj.weight": ("blk.{i}.attn_k_b.weight",
                                                        "blk.{i}.attn_v_b.weight"),
        "model.layers.{i}.mlp.gate.e_score_correction_bias": "blk.{i}.exp_probs_b.bias",
        "model.layers.{i}.mlp.experts.gate_up_proj": ("blk.{i}.ffn_gate_exps.weight",
                                                     "blk.{i}.ffn_up_exps.weight"),
        "model.layers.{i}.mlp.experts.down_proj": "blk.{i}.ffn_down_exps.weight"}
    | gguf_block_tensors(
        ("self_attn.q_a_proj", "attn_q_a"), ("self_attn.q_a_layernorm", "attn_q_a_norm"),
        ("self_attn.q_b_proj", "attn_q_b"), ("self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa"),
        ("self_attn.kv_a_layernorm", "attn_kv_a_norm"), ("self_attn.o_proj", "attn_output"),
        ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"),
        ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down"),
        ("mlp.gate", "ffn_gate_inp"), ("mlp.shared_experts.gate_proj", "ffn_gate_shexp"),
        ("mlp.shared_experts.up_proj", "ffn_up_shexp"),
        ("mlp.shared_experts.down_proj", "ffn_down_shexp")),
    fixes={"model.layers.{i}.self_attn.kv_b_proj.weight": "latent_kv_joined"},
    unread=("rope.scaling.yarn_ext_factor", "rope.scaling.yarn_attn_factor",
            "attention.sliding_window"))

FAMILY = replace(
    MIXTRAL, name="deepseek_v3", title="DeepSeek-V3", model_types=("deepseek_v3",), moe=moe,
    d_mlp=d_expert, shared_experts="shared_experts", taps=MLA_TAPS, qk_weights=None,
    heads=heads, recompute_block=block, recompute_final_norm=final_norm,
    head_taps=("self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj"),
    kv_cache_values=kv_cache_values, head_dim_attr="v_head_dim",
    qk_head_dim=lambda cfg: int(cfg.qk_nope_head_dim) + int(cfg.qk_rope_head_dim),
    router_score_bias="e_score_correction_bias", llamacpp_names=LLAMACPP_NAMES,
    gguf_weights=GGUF_WEIGHTS,
    labels={**MIXTRAL.labels, "q_a_proj": "Q down-projection (latent)",
            "q_b_proj": "Q up-projection", "kv_a_proj_with_mqa": "K/V latent and shared RoPE K",
            "kv_b_proj": "K/V up-projection", "q_a_layernorm": "Q latent norm",
            "kv_a_layernorm": "K/V latent norm"},
    tiny=dict(model_type="deepseek_v3", num_hidden_layers=3, hidden_size=64,
              intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
              num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
              routed_scaling_factor=2.5, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
              v_head_dim=16, qk_nope_head_dim=16, n_group=4, topk_group=2,
              num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=True,
              vocab_size=1000, max_position_embeddings=64, rope_interleave=True,
              tie_word_embeddings=False),
)
