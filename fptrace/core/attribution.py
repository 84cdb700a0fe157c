"""Direct logit attribution: the last position's final stream taken apart into what each part
wrote, each part in logits of a target token, summing to the model's own logit.

The last position's final stream is x = embed + Σ_blocks (attn_l + mlp_l) (checked on every
trace). The final norm is frozen at its actual value for this x, which makes it a linear map
(centre for a LayerNorm, then a per-feature gain, plus its bias once); the LM head row of the
target (minus the row of `versus`) then turns every part of x into a number of logits. The parts
sum to the model's logit: `ok` says whether they do, within a tolerance from the dtype.

Attention is split per head through the matching columns of W_O (its bias on a row of its own).
For families that normalise the attention output before adding it (Gemma 2/3, OLMo 2), that norm
is frozen at its actual value too, so the split stays linear and still sums. With a final-logit
softcap (Gemma 2/3) the parts sum to the logit *before* the cap.

`fptrace attribute` shows these parts; `fptrace ablate` shows them beside the total effect of
removing a part (its direct effect: what the part wrote straight into the logits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fptrace.core.fragments import token_id
from fptrace.core.hooks import Capture, Hook, capture_stats, first_output, hooked
from fptrace.core.routing import (
    expert_output,
    kept_routes,
    last_route_hooks,
    moe_facts,
    routers,
    shared_output,
)
from fptrace.core.trace import layer_stats, model_info
from fptrace.errors import BadInput, UnsupportedModel, as_parameter
from fptrace.families.kinds import NormKind
from fptrace.families.parts import output_projection
from fptrace.models.loading import LoadedModel
from fptrace.models.prompts import Prepared, Prompt
from fptrace.notes import EXPERTS_UNSPLIT, HEADS_UNSPLIT

if TYPE_CHECKING:
    import torch
    from torch import nn

# the parts a block's MLP writes: whole, or (a mixture of experts) as its experts
MLP_PARTS = ("mlp", "expert", "shared_experts")
RTOL = 1e-4  # float32: |sum − logit| ≤ RTOL · max(1, Σ|parts|)
HALF_RTOL = 2e-2  # a half-precision model rounds its own stream and logits at this level


def rtol_for(dtype: str) -> float:
    return RTOL if dtype == "float32" else HALF_RTOL


def frozen_norm(module: nn.Module, x: torch.Tensor, norm_type: NormKind
                ) -> tuple[bool, torch.Tensor, torch.Tensor | None]:
    """A norm at its input x (d,), as the linear map it is there: (centre, gain (d,), bias (d,)
    or None), so that norm(x) = (x − mean(x) if centre else x) · gain + bias, and the same map
    applied to each part of x sums to norm(x). For rows x (N, d), each row's own map: gain
    (N, d)."""
    import torch

    x = x if x.dtype == torch.float64 else x.float()  # float64 stays (graph's exact pass)
    variance_eps = getattr(module, "variance_epsilon", None)
    eps: float = getattr(module, "eps", 1e-5) if variance_eps is None else variance_eps
    weight: torch.Tensor | None = getattr(module, "weight", None)
    w = weight.float().to(x.device) if weight is not None else torch.ones_like(x)
    if norm_type is NormKind.layernorm:
        centred = x - x.mean(dim=-1, keepdim=True)
        scale = torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps)
        bias = getattr(module, "bias", None)
        return True, w * scale, None if bias is None else bias.float().to(x.device)
    if norm_type.is_rms:
        scale = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
        gain = (1.0 + w) if norm_type.one_plus else w
        return False, gain * scale, None
    raise UnsupportedModel(f"attribution needs to know the final norm; the {norm_type.value!r} norm "
                           "of this model is not one fptrace can freeze")


def through_frozen(parts: torch.Tensor, centre: bool, gain: torch.Tensor) -> torch.Tensor:
    """(..., d) parts through a frozen norm (frozen_norm's centre and gain), without its
    bias."""
    if centre:
        parts = parts - parts.mean(dim=-1, keepdim=True)
    return parts * gain


@dataclass
class DirectLogits:
    """One clean forward pass of a prompt with its last position's stream taken apart.

    parts: (component, layer, index, logits) in stream order: `embed`, per block each
    `attn_head` (index: the head; and `attn_bias`) or `attn` (a block whose heads do not add
    up), then `mlp`, or for a mixture of experts each chosen `expert` (index: the expert) and
    `shared_experts`, then `final_norm_bias` and `lm_head_bias`."""

    lm: LoadedModel
    prepared: Prepared  # the prompt as the model took it
    ids: list[int]
    logits: torch.Tensor  # (V,) the model's own last-position logits (after any softcap)
    target: int
    versus: int | None
    parts: list[tuple[str, int | None, int | None, float]]
    model_logit: float  # the model's logit of target (minus versus), before any softcap
    rtol: float
    cap: Capture  # the clean pass's per-layer statistics (the stream at the last position)
    y: list  # per block: (nh·hd,) W_O's input at the last position, or None
    o: list  # per block: (d,) W_O's output at the last position (post-norm families), or None
    w_o: list  # per block: (W (d, nh·hd), bias (d,) or None), float32
    centre: bool = False
    gain: Any = None  # the frozen final norm's gain (d,)
    u: Any = None  # the target's unembedding row minus versus's (d,)
    notes: list[str] = field(default_factory=list)
    routes: dict = field(default_factory=dict)  # per MoE block: its LastRoute (core/routing)

    @property
    def total(self) -> float:
        return sum(p[3] for p in self.parts)

    @property
    def scale(self) -> float:
        return max(1.0, sum(abs(p[3]) for p in self.parts))

    @property
    def difference(self) -> float:
        return self.total - self.model_logit

    @property
    def ok(self) -> bool:
        return abs(self.difference) <= self.rtol * self.scale

    @property
    def tolerance(self) -> str:
        return (f"|sum − logit| ≤ {self.rtol:g}·max(1, Σ|parts|) = "
                f"{self.rtol * self.scale:.3g}")

    def value(self, part: torch.Tensor) -> torch.Tensor:
        """(..., d) vectors written into the stream -> (...) logits of the target, through the
        final norm frozen at its actual value (without its bias)."""
        return through_frozen(part.float(), self.centre, self.gain) @ self.u

    def head_writes(self, layer: int, y: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """What each head of block `layer` writes into the stream when W_O's input is y
        (nh·hd,), through the attention post-norm frozen at its input in the clean pass: see
        head_writes below."""
        info = model_info(self.lm)
        return head_writes(self.lm, layer, y, self.o[layer], self.w_o[layer], info.n_heads,
                           info.head_dim)


def head_writes(lm: LoadedModel, layer: int, y: torch.Tensor | None, o: Any, w_o: tuple,
                nh: int, hd: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """What each head of block `layer` writes into the stream at one position, (nh, d), and the
    W_O bias (and post-norm bias) as written (d,) or None, computed in W_O's dtype; None when
    y is missing or W_O is not nh·hd wide.

    y: (nh·hd,) the heads side by side entering W_O; o: (d,) W_O's actual output, at which a
    family's attention post-norm is frozen (post-norm families); w_o: (W (d, nh·hd), bias)."""
    import torch

    W, b = w_o  # (d, nh·hd), (d,) or None
    if y is None or W.shape[1] != nh * hd:
        return None
    d = W.shape[0]
    parts = torch.einsum("dnh,nh->nd", W.view(d, nh, hd), y.view(nh, hd).to(W.device, W.dtype)
                         )  # (nh, d): what each head writes through its columns of W_O
    bias = b
    fam = lm.parts.family
    if fam.attn_added:  # the post-norm, frozen at its actual input o = Σ parts + b
        centre, gain, nb = frozen_norm(lm.parts.attn_adds[layer], o, fam.norm_type)
        gain, nb = gain.to(parts.device, parts.dtype), \
            None if nb is None else nb.to(parts.device, parts.dtype)
        parts = through_frozen(parts, centre, gain)
        bias = None if b is None else through_frozen(b, centre, gain)
        if nb is not None:
            bias = nb if bias is None else bias + nb
    return parts, bias


def head_parts(lm: LoadedModel, layer: int, y: torch.Tensor | None, o: Any, w_o: tuple,
               nh: int, hd: int, attn_added: torch.Tensor, dtype: str
               ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """head_writes, checked: None also when the per-head writes do not add up to what attention
    added, attn_added (d,) (then they are not shown), within the tolerance of the model's
    dtype."""
    got = head_writes(lm, layer, y, o, w_o, nh, hd)
    if got is None:
        return None
    parts, bias = got
    added = parts.sum(dim=0) + (bias if bias is not None else 0)  # (d,)
    attn_added = attn_added.to(added.device, added.dtype)
    scale = float(attn_added.abs().max())
    if float((added - attn_added).abs().max()) > rtol_for(dtype) * max(scale, 1.0):
        return None
    return parts, bias


def direct_logits(lm: LoadedModel, prompt: Prompt, *, target: str | None = None,
                  versus: str | None = None, named: Callable[[str], str] = as_parameter
                  ) -> DirectLogits:
    """Run the prompt once and take its last position's stream apart (see the module's text):
    the target is the model's top-1 unless given (one token, or #ID). `named`: how an error
    names `target` and `versus` (the CLI: --target, --versus)."""
    import torch

    fam = lm.parts.family
    info = model_info(lm)
    prepared = lm.prepare(prompt)
    ids = list(prepared.ids)
    cap = Capture(mask=None, home=lm.device)
    got: dict[str, Any] = {"y": [None] * info.n_layers, "o": [None] * info.n_layers}
    hooks = []
    w_o = []
    for i, attn in enumerate(lm.parts.attns):
        proj, weights = output_projection(attn, fam.w_o)
        w_o.append(weights)
        hooks.append(Hook.before(proj, _keep_input(got["y"], i, cap)))
        if fam.attn_added:
            hooks.append(Hook.before(lm.parts.attn_adds[i], _keep_input(got["o"], i, cap)))
    hooks.append(Hook.after(lm.parts.lm_head, _keep_output(got, "pre_cap", cap)))
    moe_blocks = [i for i, _ in routers(lm.parts)] if moe_facts(lm.parts, lm.config) else []
    kept: dict[int, dict] = {}
    hooks += last_route_hooks(lm.parts, moe_blocks, kept)
    with torch.inference_mode(), hooked(hooks), capture_stats(lm.parts, cap):
        logits = lm.model(torch.tensor([ids], device=lm.device), use_cache=False,
                          logits_to_keep=1).logits[0, -1].float()  # (V,)
    _, checks = layer_stats(lm, cap, snippet=0, logit_lens=False)
    if not checks[0].holds:
        raise UnsupportedModel(f"cannot attribute: {checks[0].note()}")
    t = int(logits.argmax()) if target is None else \
        token_id(lm, target, named("target"), prepared)
    v = None if versus is None else token_id(lm, versus, named("versus"), prepared)
    if v == t:
        raise BadInput(f"{named('target')} and {named('versus')} are the same token")
    pre_cap = got["pre_cap"]
    d = DirectLogits(lm=lm, prepared=prepared, ids=ids, logits=logits, target=t, versus=v, parts=[],
                     model_logit=float(pre_cap[t] - (pre_cap[v] if v is not None else 0)),
                     rtol=rtol_for(info.dtype), cap=cap, y=got["y"], o=got["o"], w_o=w_o,
                     routes=kept_routes(lm.parts, kept))
    with torch.inference_mode():
        _take_apart(d)
    return d


def _keep_input(store: list, i: int, cap: Capture) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple) -> None:
        store[i] = cap.take_last(args[0])[0]  # (in,) at the last position
    return hook


def _keep_output(store: dict, key: str, cap: Capture) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple, output: object) -> None:
        store[key] = cap.take_last(first_output(output))[0]  # (V,)
    return hook


def _take_apart(d: DirectLogits) -> None:
    """Fill d.parts (and the frozen final norm), with a note for each block whose heads do not
    add up to what attention added."""
    lm, cap = d.lm, d.cap
    fam = lm.parts.family
    info = model_info(lm)
    x = cap.resid_last[-1][0]  # (d,) the stream entering the final norm
    d.centre, d.gain, norm_bias = frozen_norm(lm.parts.final_norm, x, fam.norm_type)
    W_U = lm.parts.lm_head.weight.float()
    t, v = d.target, d.versus
    d.u = W_U[t] - (W_U[v] if v is not None else 0)  # (d,)
    head_bias = getattr(lm.parts.lm_head, "bias", None)

    parts: list[tuple[str, int | None, int | None, float]] = [
        ("embed", None, None, float(d.value(cap.embed_last[0])))]
    for layer in range(info.n_layers):
        per_head = _split(d, layer)
        if per_head is None:
            parts.append(("attn", layer, None, float(d.value(cap.attn_last[layer][0]))))
            d.notes.append(HEADS_UNSPLIT(layer=layer))
        else:
            heads, bias = per_head
            parts += [("attn_head", layer, h, float(c)) for h, c in enumerate(heads)]
            if bias is not None:
                parts.append(("attn_bias", layer, None, bias))
        split = _experts(d, layer) if layer in d.routes else None
        if split is None:
            parts.append(("mlp", layer, None, float(d.value(cap.mlp_last[layer][0]))))
            if layer in d.routes:
                d.notes.append(EXPERTS_UNSPLIT(layer=layer))
        else:
            parts += split
    if norm_bias is not None:
        parts.append(("final_norm_bias", None, None, float(norm_bias @ d.u)))
    if head_bias is not None:
        parts.append(("lm_head_bias", None, None,
                      float(head_bias[t] - (head_bias[v] if v is not None else 0))))
    d.parts = parts


def _experts(d: DirectLogits, layer: int) -> list[tuple[str, int, int | None, float]] | None:
    """An MoE block's output at the last position as its parts: each chosen expert's output
    (its experts module run on that expert alone) × its weight, and the shared experts' (their
    own modules); None when they do not add up to what the block added (then it is one part)."""
    r = d.routes[layer]
    writes = [(e, w * expert_output(d.lm.parts, layer, r.x, e)) for e, w in
              zip(r.indices.tolist(), r.weights.float().tolist(), strict=True)]
    shared = shared_output(d.lm.parts, layer, r.x)
    total = sum((v for _, v in writes), start=shared if shared is not None else 0)
    added = d.cap.mlp_last[layer][0].float()
    if float((total - added.to(total.device)).abs().max()) > \
            d.rtol * max(1.0, float(added.abs().max())):
        return None
    writes.sort(key=lambda p: p[0])  # by expert
    out: list[tuple[str, int, int | None, float]] = [
        ("expert", layer, e, float(d.value(v.to(d.u.device)))) for e, v in writes]
    if shared is not None:
        out.append(("shared_experts", layer, None, float(d.value(shared.to(d.u.device)))))
    return out


def _split(d: DirectLogits, layer: int) -> tuple[torch.Tensor, float | None] | None:
    """Per-head logits of block `layer`'s attention, and its W_O bias's; None when the per-head
    writes do not add up to what attention added (then they are not shown)."""
    info = model_info(d.lm)
    got = head_parts(d.lm, layer, d.y[layer], d.o[layer], d.w_o[layer], info.n_heads,
                     info.head_dim, d.cap.attn_last[layer][0], info.dtype)
    if got is None:
        return None
    writes, bias = got
    return d.value(writes), (None if bias is None else float(d.value(bias)))


__all__ = [
    "HALF_RTOL",
    "MLP_PARTS",
    "RTOL",
    "DirectLogits",
    "direct_logits",
    "frozen_norm",
    "head_parts",
    "head_writes",
    "rtol_for",
    "through_frozen",
]
