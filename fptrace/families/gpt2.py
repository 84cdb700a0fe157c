"""GPT-2: learned absolute positions, LayerNorm, fused QKV (Conv1D), GELU MLP.

The block recomputation in the manner of nanoGPT: B batch, T positions, C = n_embd, nh heads of
hs = C / nh values. GPT-2 stores its linear layers as Conv1D, whose weight is (in, out), so a
projection is `x @ W + b` with no transpose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fptrace.families import Family, LlamaCppNames, Tap
from fptrace.families.kinds import MlpKind, NormKind, PositionKind
from fptrace.families.ops import (
    LAYERNORM_FORMULA,
    Steps,
    attention_scale,
    causal_attention,
    gelu,
    layer_norm,
)
from fptrace.points import Point

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig


def heads(qkv: torch.Tensor, attn: Any, cfg: PretrainedConfig, layer: int, s: Steps,
          model: nn.Module, fam: Family) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv (B, T, 3C), c_attn's output -> q, k, v (B, nh, T, hs) each (no RoPE: GPT-2's
    positions were added to the embedding)."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    nh = cfg.n_head
    hs = C // nh
    q, k, v = qkv.split(C, dim=2)  # 3 × (B, T, C)
    s("split → Q, K, V", f"q, k, v = qkv[…, 0:{C}], qkv[…, {C}:{2 * C}], qkv[…, {2 * C}:]", q,
      note="K and V have the same shape", shown="Q")
    q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
    k = k.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
    v = v.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
    s("heads", f"q → (B, T, {nh}, {hs}) → transpose(1, 2); same for k, v", q, point=Point.q)
    return q, k, v


def block(x: torch.Tensor, blk: Any, cfg: PretrainedConfig, layer: int, s: Steps, model: nn.Module,
          fam: Family) -> torch.Tensor:
    """x: (B, T, C), the residual stream entering block `layer`. Returns the stream leaving it."""
    B, T, C = x.shape
    hs = C // cfg.n_head
    eps = cfg.layer_norm_epsilon
    ln_1, attn, ln_2, mlp = blk.ln_1, blk.attn, blk.ln_2, blk.mlp

    s.section = "attention"
    h = layer_norm(x, ln_1, eps)  # (B, T, C)
    s("ln_1", LAYERNORM_FORMULA + "   (LayerNorm over C)", h, point=Point.ln1)
    qkv = h @ attn.c_attn.weight + attn.c_attn.bias  # (B, T, 3C)
    s("c_attn (fused QKV)", f"qkv = h · W_qkv + b   W_qkv is ({C}, {3 * C})", qkv)
    q, k, v = heads(qkv, attn, cfg, layer, s, model, fam)  # 3 × (B, nh, T, hs)
    y = causal_attention(q, k, v, s, scale=attention_scale(cfg, layer, hs))  # (B, T, C)
    attn_out = y @ attn.c_proj.weight + attn.c_proj.bias  # (B, T, C)
    s("c_proj (W_O)", "attn_out = y · W_O + b", attn_out, keep=True, point=Point.attn_out)
    x = x + attn_out  # (B, T, C)
    s("residual add", "x = x + attn_out", x, point=Point.resid_mid)

    s.section = "mlp"
    h = layer_norm(x, ln_2, eps)  # (B, T, C)
    s("ln_2", LAYERNORM_FORMULA, h, point=Point.ln2)
    u = h @ mlp.c_fc.weight + mlp.c_fc.bias  # (B, T, 4C)
    s("c_fc (MLP up)", f"u = h · W_up + b   W_up is ({C}, {u.shape[-1]})", u, point=Point.mlp_up)
    a, formula = gelu(u, cfg.activation_function)  # (B, T, 4C)
    s("GELU", formula, a, point=Point.mlp_act)
    mlp_out = a @ mlp.c_proj.weight + mlp.c_proj.bias  # (B, T, C)
    s("c_proj (MLP down)", "mlp_out = a · W_down + b", mlp_out, keep=True, point=Point.mlp_out)
    x = x + mlp_out  # (B, T, C)
    s("residual add", "x = x + mlp_out", x, point=Point.resid_post)
    return x


def qk_weights(attn: Any, nh: int, nkv: int, hd: int
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """W_Q, b_Q, W_K, b_K out of the fused c_attn, a Conv1D whose (C, 3C) weight holds
    [W_q | W_k | W_v]: transposed to (out, in) as nn.Linear stores them."""
    W, b = attn.c_attn.weight, attn.c_attn.bias  # (C, 3C), (3C,)
    C = nh * hd
    return W[:, :C].T, b[:C], W[:, C:2 * C].T, b[C:2 * C]


def final_norm(x: torch.Tensor, norm: Any, cfg: PretrainedConfig, s: Steps) -> torch.Tensor:
    h = layer_norm(x, norm, cfg.layer_norm_epsilon)  # (B, T, C)
    s("ln_f (final norm)", LAYERNORM_FORMULA, h, point=Point.final_norm)
    return h


# llama.cpp's gpt2 graph (checked on a tiny GGUF, tests/test_llamacpp_families.py): the token
# embedding plus the learned position's is `inpL`; each LayerNorm's output after its weight and
# bias is `attn_norm` / `ffn_norm`; q, k and v are `Qcur`, `Kcur`, `Vcur`, views of the fused
# projection (with its bias) cut into heads, no rotation; the MLP's up projection with its bias
# is `ffn_up_b` (`ffn_up` is before the bias), its GELU (tanh form, as GPT-2's gelu_new) is
# `ffn_gelu`, the down projection with its bias `ffn_out`. The attention output (c_proj with its
# bias) is not named: `ffn_inp`'s operand 0 is it. The converter stores each Conv1D weight
# transposed, (out, in) as every other GGUF linear.
LLAMACPP_NAMES = LlamaCppNames(
    archs=("gpt2",), operands={"attn_out": ("ffn_inp", 0)},
    points={Point.embed: "inpL", Point.ln1: "attn_norm", Point.q: "Qcur", Point.k: "Kcur",
            Point.v: "Vcur", Point.z: "kqv_out", Point.attn_out: "attn_out",
            Point.resid_mid: "ffn_inp", Point.ln2: "ffn_norm", Point.mlp_up: "ffn_up_b",
            Point.mlp_act: "ffn_gelu", Point.mlp_out: "ffn_out", Point.resid_post: "l_out",
            Point.final_norm: "result_norm", Point.logits: "result_output"},
    no_emulation="GPT-2's Conv1D weights are stored (in, out), which the act-q8 step does not "
                 "read, its LayerNorm is no step, and its GELU comes from ggml's float16 table, "
                 "which no step reproduces")

FAMILY = Family(
    name="gpt2", title="GPT-2", model_types=("gpt2",),
    blocks="transformer.h", embed="transformer.wte", pos_embed="transformer.wpe",
    final_norm="transformer.ln_f", lm_head="lm_head", attn="attn", mlp="mlp",
    norm_type=NormKind.layernorm, mlp_type=MlpKind.gelu, positions=PositionKind.learned,
    recompute_block=block, recompute_final_norm=final_norm,
    w_o=("c_proj",), attn_norm="ln_1", qk_weights=qk_weights,
    labels={"ln_1": "norm before attention", "ln_2": "norm before the MLP",
            "c_attn": "fused QKV projection", "c_fc": "MLP up", "c_proj": "MLP down"},
    taps={Point.ln1: Tap("ln_1"), Point.z: Tap("attn.c_proj", "in"),
          Point.attn_out: Tap("attn.c_proj"), Point.resid_mid: Tap("ln_2", "in"),
          Point.ln2: Tap("ln_2"), Point.mlp_up: Tap("mlp.c_fc"),
          Point.mlp_act: Tap("mlp.c_proj", "in"), Point.mlp_out: Tap("mlp.c_proj")},
    head_taps=("attn.c_attn",), heads=heads,
    d_mlp=lambda config: getattr(config, "n_inner", None) or 4 * config.n_embd,
    llamacpp_names=LLAMACPP_NAMES,
    # what transformers' GGUF loader leaves at GPT-2's defaults: the positions the learned
    # embedding holds (it reads context_length into n_ctx, which GPT2Config does not use) and
    # the MLP's width (it reads feed_forward_length into a key of its own name)
    gguf_config={"n_positions": "context_length", "n_inner": "feed_forward_length"},
    tiny=dict(model_type="gpt2", n_layer=3, n_embd=64, n_head=4, vocab_size=1000,
              n_positions=64),
)
