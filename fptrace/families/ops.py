"""What the families' block recomputations share, written once: the recorder they write each
step to, the norms, the projections, rotary position embeddings, grouped-query repetition, the
attention core and the gated MLP.

Straight-line code in the manner of nanoGPT: B batch, T positions, C = d_model, nh query heads
and nkv key/value heads of hd values each. Every function takes the recorder `s` where it makes a
tensor worth showing; each `s(...)` names the tensor, says how it was made and keeps its shape
and first values; a step whose tensor is a point of the vocabulary (points.py) says which.
torch is imported inside the functions, so importing a family does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fptrace.families.kinds import Scoring
from fptrace.points import Point
from fptrace.results import ExplainStep

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig

    from fptrace.families import Family, Moe


@dataclass
class Steps:
    """The recorder: each call names a tensor, says how it was made, and keeps its shape and a
    few of its values (never the tensor itself, except the few the checks and the attention
    tables need)."""

    head: int  # the query head shown
    kv_head: int  # the key/value head it reads
    n_heads: int
    n_kv_heads: int
    n_preview: int = 4
    section: str = "attention"
    items: list = field(default_factory=list)
    kept: dict = field(default_factory=dict)  # name -> tensor, for checks and tables
    quiet: bool = False  # record nothing (diff --deep runs a family's ops for their results)

    def __call__(self, name: str, formula: str, t: torch.Tensor, note: str | None = None,
                 keep: bool = False, shown: str | None = None, point: Point | None = None
                 ) -> torch.Tensor:
        """shown: which tensor the preview values are of, when a step makes several (Q and K);
        point: the trace point the tensor is, where it is one."""
        if self.quiet:
            return t
        where, values = self._preview(t)
        if shown:
            where = f"{shown}, {where}"
        self.items.append(ExplainStep(
            index=len(self.items) + 1, section=self.section, name=name, formula=formula,
            shape=tuple(int(d) for d in t.shape), where=where,
            preview=tuple(float(v) for v in values), note=note,
            point=None if point is None else point.value))
        if keep:
            self.kept[name] = t.detach()
        return t

    def _preview(self, t: torch.Tensor) -> tuple[str, list[float]]:
        """A few values a reader can follow from step to step: the last position; for a
        per-head tensor, the chosen head (or the key/value head it reads)."""
        n = self.n_preview
        if t.dim() == 4:  # (B, heads, T, X)
            h = self.head if t.shape[1] == self.n_heads else self.kv_head
            T = t.shape[2]
            return f"head {h}, pos {T - 1}", t[0, h, -1, :n].tolist()
        if t.dim() == 3:  # (B, T, X)
            return f"pos {t.shape[1] - 1}", t[0, -1, :n].tolist()
        if t.dim() == 2 and t.shape[0] == t.shape[1] and t.shape[0] > 1:  # a (T, T) mask
            return f"row {t.shape[0] - 1}", t[-1, :n].tolist()
        if t.dim() == 2:  # (B, X)
            return "first values", t[0, :n].tolist()
        return "first values", t.reshape(-1)[:n].tolist()


# ---------------------------------------------------------------- norms and projections

RMS_FORMULA = "h = x / √(mean(x²) + ε) · γ"
RMS_1W_FORMULA = "h = x / √(mean(x²) + ε) · (1 + γ)"
LAYERNORM_FORMULA = "h = (x − mean) / √(var + ε) · γ + β"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, one_plus: bool = False
             ) -> torch.Tensor:
    """RMSNorm over the last dimension; one_plus: Gemma's scale (1 + γ) instead of γ."""
    rms = (x.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()  # (..., 1)
    return x / rms * ((1.0 + weight) if one_plus else weight)  # (..., C)


def post_norm(out: torch.Tensor, blk: nn.Module, path: str | None, eps: float, s: Steps,
              name: str, letter: str, point: Point, one_plus: bool = False) -> torch.Tensor:
    """A sublayer's output `letter` normalised before the residual add by the RMSNorm at
    `path` in the block, what the stream receives (Gemma 2 and 3 with their (1 + γ) scale,
    OLMo 2); path None: no post-norm, the output as it is."""
    if path is None:
        return out
    out = rms_norm(out, blk.get_submodule(path).get_parameter("weight"), eps,
                   one_plus)  # (B, T, C)
    scale = "(1 + γ)" if one_plus else "γ"
    s(path, f"{name} = {letter} / √(mean({letter}²) + ε) · {scale}   (what the stream "
      "receives)", out, keep=True, point=point)
    return out


def layer_norm(x: torch.Tensor, ln: Any, eps: float) -> torch.Tensor:
    mu = x.mean(dim=-1, keepdim=True)  # (B, T, 1)
    var = x.var(dim=-1, keepdim=True, unbiased=False)  # (B, T, 1)
    return (x - mu) / (var + eps).sqrt() * ln.weight + ln.bias  # (B, T, C)


def linear(x: torch.Tensor, proj: Any) -> torch.Tensor:
    """nn.Linear stores (out, in): x · Wᵀ (+ b where the checkpoint has one)."""
    y = x @ proj.weight.T  # (B, T, out)
    return y if proj.bias is None else y + proj.bias


def gelu(x: torch.Tensor, name: str) -> tuple[torch.Tensor, str]:
    """The activation a config names: the tanh approximation ("gelu_new", GPT-2's default), the
    exact erf form, or ReLU; with the formula shown."""
    import torch

    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        y = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
        return y, "GELU(u) = ½u(1 + tanh(√(2/π)(u + 0.044715u³)))"
    if name == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))), "GELU(u) = ½u(1 + erf(u/√2))"
    if name == "relu":
        return torch.relu(x), "ReLU(u) = max(u, 0)"
    raise ValueError(f"activation {name!r}")


def project_qkv(h: torch.Tensor, attn: Any, nh: int, nkv: int, hd: int, s: Steps,
                src: str = "h") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
    s("v_proj", f"v = {src} · W_vᵀ{bias}   W_v is ({nkv * hd}, {C})", v, point=Point.v)
    return q, k, v


def split_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, nh: int, nkv: int, hd: int,
                s: Steps) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T, heads*hd) -> (B, heads, T, hd) for q (nh heads), k and v (nkv heads)."""
    B, T, _ = q.shape
    q = q.view(B, T, nh, hd).transpose(1, 2)  # (B, nh, T, hd)
    k = k.view(B, T, nkv, hd).transpose(1, 2)  # (B, nkv, T, hd)
    v = v.view(B, T, nkv, hd).transpose(1, 2)  # (B, nkv, T, hd)
    s("heads", f"q → (B, T, {nh}, {hd}) → transpose(1, 2); k, v → (B, {nkv}, T, {hd})", q,
      shown="Q")
    return q, k, v


# ---------------------------------------------------------------- rotary position embeddings

def rotate_half(t: torch.Tensor) -> torch.Tensor:
    import torch

    half = t.shape[-1] // 2
    return torch.cat((-t[..., half:], t[..., :half]), dim=-1)  # (..., hd)


def apply_rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first cos.shape[-1] values of each head of t (all of them unless the family
    uses partial rotary); the rest pass unchanged."""
    import torch

    rot = cos.shape[-1]
    r = t[..., :rot]  # (B, heads, T, rot)
    return torch.cat((r * cos + rotate_half(r) * sin, t[..., rot:]), dim=-1)  # (B, heads, T, hd)


def rotary_dims(cfg: PretrainedConfig, hd: int) -> int:
    """How many values of each head RoPE rotates: all hd, unless the config sets a partial
    rotary factor (Phi-3's partial_rotary_factor, GPT-NeoX's rotary_pct)."""
    params = getattr(cfg, "rope_parameters", None) or {}
    return int(hd * params.get("partial_rotary_factor", getattr(cfg, "rotary_pct", 1.0)))


def rope_tables(cfg: PretrainedConfig, T: int, hd: int, model: nn.Module, device: torch.device,
                layer: int | None = None) -> tuple[torch.Tensor, torch.Tensor, str]:
    """cos and sin, (T, hd) each, for positions 0..T-1; plus the formula shown. A config whose
    RoPE parameters differ by layer type (Gemma 3: local and global bases) gives block
    `layer` the parameters of its type."""
    import torch

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


# ---------------------------------------------------------------- attention

def sliding_window(cfg: PretrainedConfig, layer: int) -> int | None:
    """The attention window of block `layer`, or None: the config's sliding_window, unless its
    layer_types say this layer attends globally."""
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types and layer_types[layer] != "sliding_attention":
        return None
    return window


def attention_scale(cfg: PretrainedConfig, layer: int, hd: int) -> float:
    """The factor q · k is multiplied by in block `layer`: 1/√hd, or query_pre_attn_scalar^−½
    where the config sets it (Gemma); none when scale_attn_weights is off, and divided by
    layer + 1 with scale_attn_by_inverse_layer_idx (GPT-2's options)."""
    scale = (getattr(cfg, "query_pre_attn_scalar", None) or hd) ** -0.5
    if not getattr(cfg, "scale_attn_weights", True):
        scale = 1.0
    if getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
        scale /= float(layer + 1)
    return scale


def repeat_kv(k: torch.Tensor, v: torch.Tensor, nh: int, s: Steps
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query attention: each of the nkv key/value heads serves nh / nkv query heads.
    k, v: (B, nkv, T, hd) -> (B, nh, T, hd) each."""
    nkv = k.shape[1]
    rep = nh // nkv
    k = k.repeat_interleave(rep, dim=1)  # (B, nh, T, hd)
    v = v.repeat_interleave(rep, dim=1)  # (B, nh, T, hd)
    s("repeat K/V (GQA)", f"each of {nkv} K/V heads serves {rep} query heads" if rep > 1
      else "one K/V head per query head: nothing to repeat", k, shown="K")
    return k, v


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: Steps, *,
                     scale: float | None = None, window: int | None = None,
                     softcap: float | None = None, sinks: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """q, k, v: (B, nh, T, hd), K and V already repeated for grouped-query attention.
    softcap: Gemma 2's attention-logit cap, cap·tanh(scores / cap), before the mask.
    sinks: gpt-oss's learned logit per head (nh,), a column every query sees in the softmax,
    dropped after it (its share of each row goes nowhere).
    Returns y: (B, T, nh*hd), the heads side by side, ready for W_O."""
    import torch

    B, nh, T, hd = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(hd)
    att = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, T)
    s("scores", f"att = q · kᵀ / √{hd}" if math.isclose(scale, 1.0 / math.sqrt(hd))
      else f"att = q · kᵀ · {scale:g}", att, keep=True)
    if softcap:
        att = torch.tanh(att / softcap) * softcap  # (B, nh, T, T)
        s("softcap", f"att = {softcap:g} · tanh(att / {softcap:g})   (scores kept within "
          f"±{softcap:g})", att)
    i = torch.arange(T, device=q.device)[:, None]  # (T, 1) query positions
    j = torch.arange(T, device=q.device)[None, :]  # (1, T) key positions
    hidden = (j > i) | ((i - j >= window) if window else torch.zeros_like(j > i))  # (T, T)
    mask = torch.zeros(T, T, device=q.device).masked_fill(hidden, float("-inf"))  # (T, T)
    s("causal mask", "mask[i, j] = −∞ where j > i" + (f" or i − j ≥ {window}" if window else "")
      + ", else 0", mask)
    att = att + mask  # (B, nh, T, T)
    s("scores + mask", "att = att + mask   (position i sees positions 0..i)", att, keep=True)
    if sinks is not None:  # gpt-oss: one more logit per head, the sink, in every row
        sink = sinks.float()[None, :, None, None].expand(B, nh, T, 1)  # (B, nh, T, 1)
        both = torch.cat([att, sink], dim=-1)  # (B, nh, T, T+1)
        both = torch.exp(both - both.amax(dim=-1, keepdim=True))  # (B, nh, T, T+1)
        both = both / both.sum(dim=-1, keepdim=True)  # (B, nh, T, T+1)
        att, sunk = both[..., :-1], both[..., -1]  # (B, nh, T, T), (B, nh, T)
        s.kept["sink weight"] = sunk
        s("softmax (with the sink)", "w = softmax over [att, sink_h] per row, the sink's column "
          "dropped   (each row sums to 1 − its sink weight)", att, keep=True,
          point=Point.attn_weights, note=f"head {s.head}, pos {T - 1}: the sink takes "
          f"{float(sunk[0, s.head, -1]):.3f} of the row" if not s.quiet else None)
        s.kept["softmax"] = att
    else:
        att = torch.exp(att - att.amax(dim=-1, keepdim=True))  # (B, nh, T, T)
        att = att / att.sum(dim=-1, keepdim=True)  # (B, nh, T, T)
        s("softmax", "w = exp(att − max) / Σ_j exp(att − max)   (each row sums to 1)", att,
          keep=True, point=Point.attn_weights)
    y = att @ v  # (B, nh, T, hd)
    s("weights · V", "y = w · v", y)
    vd = v.shape[-1]  # values per head: hd, or DeepSeek-V3's v_head_dim
    y = y.transpose(1, 2).reshape(B, T, nh * vd)  # (B, T, nh*vd)
    s("concat heads", f"y → transpose(1, 2) → (B, T, {nh * vd})", y, point=Point.z)
    return y


# ---------------------------------------------------------------- MLP

def gated_mlp(h: torch.Tensor, mlp: Any, s: Steps, act: str = "silu", src: str = "h",
              inner_points: bool = True) -> torch.Tensor:
    """down(act(gate(h)) · up(h)): SwiGLU (act "silu") or GeGLU (a GELU name). (B, T, C).
    inner_points: tag gate, up and the activation as trace points (off where the family's
    blocks differ and only the MLP's output is a point every block shows: DeepSeek-V3)."""
    C = h.shape[-1]
    gate = linear(h, mlp.gate_proj)  # (B, T, I)
    up = linear(h, mlp.up_proj)  # (B, T, I)
    tag = (lambda p: p) if inner_points else (lambda p: None)
    s("gate_proj", f"g = {src} · W_gateᵀ   W_gate is ({gate.shape[-1]}, {C})", gate,
      point=tag(Point.mlp_gate))
    s("up_proj", f"u = {src} · W_upᵀ   W_up is ({up.shape[-1]}, {C})", up,
      point=tag(Point.mlp_up))
    if act == "silu":
        a = gate * gate.sigmoid() * up  # (B, T, I)
        s("SiLU(gate) · up", "a = g · σ(g) · u   (SwiGLU)", a, point=tag(Point.mlp_act))
    else:
        g, formula = gelu(gate, act)  # (B, T, I)
        a = g * up  # (B, T, I)
        s("GELU(gate) · up", "a = GELU(g) · u   (GeGLU)", a, note=f"{formula}, applied to g",
          point=tag(Point.mlp_act))
    m = linear(a, mlp.down_proj)  # (B, T, C)
    s("down_proj", f"m = a · W_downᵀ   W_down is ({C}, {a.shape[-1]})", m, keep=True,
      point=Point.mlp_out)
    return m


# ---------------------------------------------------------------- mixture of experts

def route(logits: torch.Tensor, moe: Moe, bias: torch.Tensor | None = None,
          exclude: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A family's routing rule (moe: its Moe facts) on router logits (N, E): (indices (N, k),
    weights (N, k)), the chosen experts and what their outputs are multiplied by.

    exclude: a bool mask (E,) of experts the choice may not take (`ablate --expert --route
    next`: each position takes its next choice instead); the scores are unchanged, so a
    position's other experts keep the weight the rule gives them. Where fewer than k experts
    remain to choose from, the slots past them hold an expert the rule may not take, with
    weight 0 (torch's top k still returns k indices): every remaining expert is taken and none
    removed is. In
    grouped routing (DeepSeek-V3) a group is worth the sum of its two best remaining experts
    (one, if one remains); a group with none is out of the choice."""
    import torch

    k = moe.top_k
    x = logits.float()  # (N, E)
    gone = None if exclude is None else exclude.to(x.device)  # (E,)
    if moe.scoring is Scoring.softmax_top_k:  # gpt-oss: the top k logits, a softmax of them
        choice = x if gone is None else x.masked_fill(gone, float("-inf"))
        top, idx = torch.topk(choice, k, dim=-1)  # (N, k) each
        if gone is None:
            return idx, torch.softmax(top, dim=-1)
        taken = torch.isfinite(top)  # (N, k): a remaining expert in that slot
        w = torch.softmax(top.masked_fill(~taken, 0.0), dim=-1) * taken  # (N, k)
        return idx, w / w.sum(dim=-1, keepdim=True).clamp(min=1e-30)
    if moe.scoring is Scoring.softmax:  # Mixtral, Qwen-MoE, OLMoE
        probs = torch.softmax(x, dim=-1)  # (N, E)
        choice = probs if gone is None else probs.masked_fill(gone, float("-inf"))  # (N, E)
        idx = torch.topk(choice, k, dim=-1).indices  # (N, k)
        w = probs.gather(1, idx)  # (N, k)
        if gone is not None:
            w = w * torch.isfinite(choice.gather(1, idx))  # 0 in a slot past the remaining
        if moe.renormalise:
            w = w / w.sum(dim=-1, keepdim=True).clamp(min=1e-30)
        return idx, w * moe.scale
    # sigmoid (DeepSeek-V3): scores; the choice adds the bias and keeps the best groups only
    scores = torch.sigmoid(x)  # (N, E)
    choice = scores if bias is None else scores + bias  # (N, E)
    if gone is not None:
        choice = choice.masked_fill(gone, float("-inf"))
    N, E = choice.shape
    G = moe.n_groups
    if G > 1:  # a group's worth: the sum of its two best scores (remaining ones)
        best2 = choice.view(N, G, E // G).topk(2, dim=-1).values  # (N, G, 2)
        group = best2.masked_fill(best2 == float("-inf"), 0.0).sum(dim=-1)  # (N, G)
        group = group.masked_fill(best2[..., 0] == float("-inf"), float("-inf"))
        best = torch.topk(group, moe.topk_groups, dim=-1).indices  # (N, topk_groups)
        keep = torch.zeros_like(group).scatter_(1, best, 1.0).bool()  # (N, G)
        keep = keep[:, :, None].expand(N, G, E // G).reshape(N, E)  # (N, E)
        choice = choice.masked_fill(~keep, float("-inf"))
    idx = torch.topk(choice, k, dim=-1).indices  # (N, k)
    w = scores.gather(1, idx)  # (N, k): the uncorrected scores
    if gone is not None:  # 0 in a slot past the remaining (removed, or outside the best groups)
        w = w * torch.isfinite(choice.gather(1, idx))
    if moe.renormalise:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return idx, w * moe.scale


def route_distribution(logits: torch.Tensor, moe: Moe) -> torch.Tensor:
    """The router's distribution over all experts (N, E): the softmax of its logits, or (sigmoid
    routers) each score over the sum of the scores."""
    import torch

    x = logits.float()
    if moe.scoring is Scoring.sigmoid:
        sc = torch.sigmoid(x)
        return sc / sc.sum(dim=-1, keepdim=True)
    return torch.softmax(x, dim=-1)


def _stored(experts: nn.Module, name: str) -> torch.Tensor:
    """An experts module's stored tensor (its 3-D weights, its 2-D biases)."""
    out: torch.Tensor = getattr(experts, name)
    return out


def expert_gate_up(x: torch.Tensor, experts: nn.Module, e: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Routed expert e's gate and up pre-activations (n, I) each on x (n, C), in x's dtype, its
    biases included, from its weights stored as 3-D tensors: gate_up_proj (E, 2·I, C) ([gate;
    up]), or, transposed (gpt-oss), (E, C, 2·I) with gate and up interleaved, with a bias
    gate_up_proj_bias (E, 2·I) where the experts have biases."""
    transposed = getattr(experts, "is_transposed", False)
    w_gu = _stored(experts, "gate_up_proj")[e].to(x.dtype)
    gu = x @ (w_gu if transposed else w_gu.T)  # (n, 2I)
    if getattr(experts, "has_bias", False):
        gu = gu + _stored(experts, "gate_up_proj_bias")[e].to(x.dtype)
    if getattr(experts, "is_concatenated", True):
        gate, up = gu.chunk(2, dim=-1)  # (n, I) each
    else:
        gate, up = gu[..., ::2], gu[..., 1::2]  # (n, I) each, interleaved
    return gate, up


def expert_down(a: torch.Tensor, experts: nn.Module, e: int, bias: bool = True) -> torch.Tensor:
    """Routed expert e's down projection of its activations a (n, I): (n, C), in a's dtype;
    down_proj (E, C, I), or (E, I, C) transposed (gpt-oss); its bias down_proj_bias (E, C)
    added where the experts have biases and `bias`."""
    transposed = getattr(experts, "is_transposed", False)
    w_d = _stored(experts, "down_proj")[e].to(a.dtype)
    y = a @ (w_d if transposed else w_d.T)  # (n, C)
    if bias and getattr(experts, "has_bias", False):
        y = y + _stored(experts, "down_proj_bias")[e].to(a.dtype)
    return y


def _expert(x: torch.Tensor, experts: Any, e: int) -> torch.Tensor:
    """Routed expert e on x (n, C) (float32): SwiGLU down(SiLU(gate) · up), or gpt-oss's
    clamped form down((up + 1) · g · σ(α·g)), g = gate capped at the limit, up within ±limit."""
    gate, up = expert_gate_up(x, experts, e)  # (n, I) each
    if hasattr(experts, "limit"):  # gpt-oss's clamped SwiGLU
        gate = gate.clamp(max=experts.limit)
        up = up.clamp(min=-experts.limit, max=experts.limit)
        a = (up + 1) * gate * (gate * experts.alpha).sigmoid()  # (n, I)
    else:
        a = gate * gate.sigmoid() * up  # (n, I)
    return expert_down(a, experts, e)  # (n, C)


def moe_mlp(h: torch.Tensor, mlp: Any, moe: Moe, s: Steps, fam: Family, src: str = "h"
            ) -> torch.Tensor:
    """A mixture of experts on h (B, T, C): the router's logits, its scores, the top k (with
    groups and the choice-only bias where the family has them), their weights, each chosen
    expert's output × its weight, the shared experts; (B, T, C), what the block adds."""
    import torch

    B, T, C = h.shape
    router = mlp.get_submodule(fam.router)
    experts = mlp.get_submodule(fam.experts)
    E, k = moe.n_experts, moe.top_k
    x = h.reshape(B * T, C)  # (N, C), N = B·T
    x = x.float()
    logits = x @ router.weight.float().T  # (N, E)
    if moe.router_bias:
        logits = logits + router.bias.float()
    s("router logits", f"r = {src} · W_routerᵀ" + (" + b" if moe.router_bias else "")
      + f"   W_router is ({E}, {C})", logits.view(B, T, E), keep=True)
    if moe.scoring is Scoring.sigmoid:
        scores = torch.sigmoid(logits)  # (N, E)
        s("scores (sigmoid)", "s_e = σ(r_e)   (each expert on its own, not a distribution)",
          scores.view(B, T, E))
    elif moe.scoring is Scoring.softmax:
        scores = torch.softmax(logits, dim=-1)  # (N, E)
        s("scores (softmax)", f"p = softmax(r) over the {E} experts", scores.view(B, T, E))
    bias = getattr(router, fam.router_score_bias) if fam.router_score_bias else None
    idx, w = route(logits, moe, None if bias is None else bias.float())  # (N, k) each
    how = {"softmax": f"the {k} largest p",
           "softmax over the top k": f"the {k} largest r",
           "sigmoid": f"the {k} largest s + b among the {moe.topk_groups} best of "
                      f"{moe.n_groups} groups (a group: the sum of its 2 best s + b)"
           if moe.n_groups > 1 else f"the {k} largest s + b"}[moe.scoring]
    s("top-k experts", how, idx.view(B, T, k).float(), keep=True,
      note=f"position {T - 1} takes experts {idx[-1].tolist()}")
    what = {"softmax": "w = p of the chosen" + (", divided by their sum" if moe.renormalise
                                                  else " (not renormalised)"),
            "softmax over the top k": "w = softmax of the chosen r (over those k only)",
            "sigmoid": "w = s of the chosen (without the bias)"
            + (", divided by their sum" if moe.renormalise else "")}[moe.scoring]
    if moe.scale != 1.0:
        what += f", × {moe.scale:g}"
    s("expert weights", what, w.view(B, T, k), keep=True)
    routed = torch.zeros_like(x)  # (N, C)
    last = idx[-1].tolist()  # the last position's choice, shown expert by expert
    for e in sorted(set(idx.flatten().tolist())):
        rows, slot = (idx == e).nonzero(as_tuple=True)  # positions that chose e, and where
        y = _expert(x[rows], experts, e) * w[rows, slot, None]  # (n, C)
        routed.index_add_(0, rows, y)
        if e in last:
            contrib = torch.zeros_like(x)  # (N, C)
            contrib.index_add_(0, rows, y)
            act = (f"((up_{e}(x) + 1) · g · σ({experts.alpha:g}·g)), g = min(gate_{e}(x), "
                   f"{experts.limit:g}), up within ±{experts.limit:g}"
                   if hasattr(experts, "limit") else f"(SiLU(gate_{e}(x)) · up_{e}(x))")
            s(f"expert {e} × weight", f"y_{e} = w_{e} · down_{e}{act}"
              f"   gate_{e}, up_{e}: ({moe.d_expert}, {C})", contrib.view(B, T, C),
              note="zero at the positions that did not choose it", keep=True)
    out = routed.view(B, T, C)  # (B, T, C)
    s("routed experts, summed", f"m = Σ over the {k} chosen of w_e · y_e", out, keep=True)
    if fam.shared_experts:
        shared_mlp = mlp.get_submodule(fam.shared_experts)
        shared = gated_mlp(h, shared_mlp, Steps(0, 0, 1, 1, quiet=True))  # (B, T, C)
        formula = "down(SiLU(gate(h)) · up(h)), every position"
        if fam.shared_expert_gate:
            g = torch.sigmoid(linear(h, mlp.get_submodule(fam.shared_expert_gate)))  # (B, T, 1)
            shared = g * shared  # (B, T, C)
            formula = "σ(h · w_gate) · " + formula
        s("shared experts", formula, shared, keep=True)
        out = out + shared  # (B, T, C)
        s("routed + shared", "m = routed + shared", out, keep=True, point=Point.mlp_out)
    else:
        s("MoE output", "m = routed (no shared expert)", out, keep=True, point=Point.mlp_out)
    return out
