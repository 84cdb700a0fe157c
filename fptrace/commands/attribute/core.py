"""`fptrace attribute`: direct logit attribution that sums exactly to the model's own logit.

The last position's final stream is x = embed + Σ_blocks (attn_l + mlp_l) (checked on every
trace). The final norm is frozen at its actual value for this x, which makes it a linear map
(centre for a LayerNorm, then a per-feature gain, plus its bias once); the LM head row of the
target (minus the row of `versus`) then turns every part of x into a number of logits. The parts
sum to the model's logit: the command shows the sum, the model's own logit and the difference,
and fails loudly (exit 5) when they disagree.

Attention is split per head through the matching columns of W_O (its bias on a row of its own).
For families that normalise the attention output before adding it (Gemma 2/3, OLMo 2), that norm
is frozen at its actual value too, so the split stays linear and still sums. With a final-logit
softcap (Gemma 2/3) the parts sum to the logit *before* the cap; both are shown.
"""

from __future__ import annotations

from typing import Any

from fptrace.commands.attribute.result import Attribution, Contribution, LayerAttribution
from fptrace.core.fragments import token_id
from fptrace.core.hooks import Capture, capture_stats, first_output, hooked
from fptrace.core.notes import HEADS_UNSPLIT, SOFTCAP
from fptrace.core.trace import base_notes, layer_stats, model_info, ranked_token
from fptrace.errors import BadInput, UnsupportedModel
from fptrace.models.loading import LoadedModel
from fptrace.models.prompts import Prepared, Prompt

RTOL = 1e-4  # float32: |sum − logit| ≤ RTOL · max(1, Σ|parts|)
HALF_RTOL = 2e-2  # a half-precision model rounds its own stream and logits at this level


def frozen_norm(module: Any, x: Any, norm_type: str) -> tuple[bool, Any, Any]:
    """A norm at its input x (d,), as the linear map it is there: (centre, gain (d,), bias (d,)
    or None), so that norm(x) = (x − mean(x) if centre else x) · gain + bias, and the same map
    applied to each part of x sums to norm(x). For rows x (N, d), each row's own map: gain
    (N, d)."""
    import torch

    x = x.float()
    eps = getattr(module, "variance_epsilon", None)
    eps = getattr(module, "eps", 1e-5) if eps is None else eps
    w = module.weight.float().to(x.device) if getattr(module, "weight", None) is not None \
        else torch.ones_like(x)
    if norm_type == "layernorm":
        centred = x - x.mean(dim=-1, keepdim=True)
        scale = torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps)
        bias = getattr(module, "bias", None)
        return True, w * scale, None if bias is None else bias.float().to(x.device)
    if norm_type.startswith("rmsnorm"):
        scale = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
        gain = (1.0 + w) if "1 + w" in norm_type else w
        return False, gain * scale, None
    raise UnsupportedModel(f"attribution needs to know the final norm; the {norm_type!r} norm "
                           "of this model is not one fptrace can freeze")


def through_frozen(parts: Any, centre: bool, gain: Any) -> Any:
    """(..., d) parts through a frozen norm (frozen_norm's centre and gain), without its
    bias."""
    if centre:
        parts = parts - parts.mean(dim=-1, keepdim=True)
    return parts * gain


def out_projection(attn: Any, names: tuple[str, ...]) -> tuple[Any, Any]:
    """The attention output projection as (out=d, in=nh·hd) and its bias (or None)."""
    for name in names:
        proj = getattr(attn, name, None)
        if proj is not None:
            w = proj.weight.float()
            if type(proj).__name__ == "Conv1D":  # GPT-2 stores (in, out)
                w = w.T
            bias = getattr(proj, "bias", None)
            return proj, (w, None if bias is None else bias.float())
    raise UnsupportedModel("cannot find the attention output projection W_O "
                           f"({', '.join(names)}) to split attention per head")


def attribute(lm: LoadedModel, prompt: Prompt, *, target: str | None = None,
              versus: str | None = None, top: int = 12) -> Attribution:
    """Direct logit attribution of the target token's logit at the last position (default:
    the model's top-1), or of the logit difference target − versus."""
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
        proj, weights = out_projection(attn, fam.w_o)
        w_o.append(weights)
        hooks.append((proj, "pre", _keep_input(got["y"], i, cap), False))
        if fam.attn_added:
            hooks.append((lm.parts.attn_adds[i], "pre", _keep_input(got["o"], i, cap), False))
    hooks.append((lm.parts.lm_head, "post", _keep_output(got, "pre_cap", cap), False))
    with torch.inference_mode(), hooked(hooks), capture_stats(lm.parts, cap):
        logits = lm.model(torch.tensor([ids], device=lm.device), use_cache=False,
                          logits_to_keep=1).logits[0, -1].float()  # (V,)
    _, checks = layer_stats(lm, cap, snippet=0, logit_lens=False)
    if not checks[0].holds:
        raise UnsupportedModel("cannot attribute: " + checks[0].note())
    t = int(logits.argmax()) if target is None else token_id(lm, target, "--target", prepared)
    v = None if versus is None else token_id(lm, versus, "--versus", prepared)
    if v == t:
        raise BadInput("--target and --versus are the same token")
    with torch.inference_mode():
        return _attribution(lm, info, prepared, cap, got, w_o, logits, t, v, top)


def _keep_input(store: list, i: int, cap: Capture) -> Any:
    def hook(module: Any, args: tuple) -> None:
        store[i] = cap.take_last(args[0])[0]  # (in,) at the last position
    return hook


def _keep_output(store: dict, key: str, cap: Capture) -> Any:
    def hook(module: Any, args: tuple, output: Any) -> None:
        store[key] = cap.take_last(first_output(output))[0]  # (V,)
    return hook


def _attribution(lm: LoadedModel, info: Any, prepared: Prepared, cap: Capture, got: dict,
                 w_o: list, logits: Any, t: int, v: int | None, top: int) -> Attribution:
    fam = lm.parts.family
    x = cap.resid_last[-1][0]  # (d,) the stream entering the final norm
    centre, gain, norm_bias = frozen_norm(lm.parts.final_norm, x, fam.norm_type)
    W_U = lm.parts.lm_head.weight.float()
    u = W_U[t] - (W_U[v] if v is not None else 0)  # (d,)
    head_bias = getattr(lm.parts.lm_head, "bias", None)
    hb = 0.0 if head_bias is None else float(head_bias[t] - (head_bias[v] if v is not None
                                                              else 0))

    def value(part: Any) -> Any:  # (..., d) -> (...) logits
        return through_frozen(part, centre, gain) @ u

    comps = [("embed", None, None, float(value(cap.embed_last[0])))]
    nh, hd = info.n_heads, info.head_dim
    head_grid, notes = [], []
    for layer in range(info.n_layers):
        attn_total = float(value(cap.attn_last[layer][0]))
        heads = head_parts(lm, layer, got["y"][layer], got["o"][layer], w_o[layer], nh, hd,
                           cap.attn_last[layer][0], info.dtype)
        if heads is None:
            comps.append(("attn", layer, None, attn_total))
            notes.append(HEADS_UNSPLIT(layer=layer))
            head_grid.append(())
        else:
            per_head = value(heads[0])  # (nh,)
            comps += [("attn_head", layer, h, float(c)) for h, c in enumerate(per_head)]
            if heads[1] is not None:
                comps.append(("attn_bias", layer, None, float(value(heads[1]))))
            head_grid.append(tuple(float(c) for c in per_head))
        comps.append(("mlp", layer, None, float(value(cap.mlp_last[layer][0]))))
    if norm_bias is not None:
        comps.append(("final_norm_bias", None, None, float(norm_bias @ u)))
    if head_bias is not None:
        comps.append(("lm_head_bias", None, None, hb))
    total = sum(c[3] for c in comps)
    pre_cap = got["pre_cap"]
    model_logit = float(pre_cap[t] - (pre_cap[v] if v is not None else 0))
    scale = max(1.0, sum(abs(c[3]) for c in comps))
    rtol = RTOL if info.dtype == "float32" else HALF_RTOL
    ok = abs(total - model_logit) <= rtol * scale
    capped = lm.parts.final_softcap is not None
    absolute = sum(abs(c[3]) for c in comps) or 1.0
    contributions = tuple(Contribution(component=k, layer=l, head=h, value=val,
                                       share=val / absolute) for k, l, h, val in comps)
    per_layer = tuple(LayerAttribution(
        layer=l, attn=sum(c.value for c in contributions if c.layer == l and
                          c.component.startswith("attn")),
        mlp=sum(c.value for c in contributions if c.layer == l and c.component == "mlp"))
        for l in range(info.n_layers))
    if capped:
        notes.append(SOFTCAP(cap=lm.parts.final_softcap))
    notes = base_notes(lm) + notes
    top_parts = tuple(sorted(contributions, key=lambda c: -abs(c.value))[:top])
    return Attribution(
        prompt=prepared.text, model=info, tokens=lm.tokens(prepared),
        target=ranked_token(lm, logits, t),
        versus=None if v is None else ranked_token(lm, logits, v),
        model_logit=model_logit,
        capped_logit=float(logits[t] - (logits[v] if v is not None else 0)) if capped else None,
        total=total, difference=total - model_logit,
        tolerance=f"|sum − logit| ≤ {rtol:g}·max(1, Σ|parts|) = {rtol * scale:.3g}", ok=ok,
        contributions=contributions, top=top_parts, layers=per_layer,
        head_grid=tuple(head_grid), notes=tuple(notes))


def head_parts(lm: LoadedModel, layer: int, y: Any, o: Any, w_o: tuple, nh: int, hd: int,
               attn_added: Any, dtype: str) -> tuple[Any, Any] | None:
    """What each head of block `layer` wrote to the stream at one position, (nh, d), and the
    W_O bias (and post-norm bias) (d,) or None; None when the per-head parts do not add up to
    what attention added (then they are not shown). Computed in the dtype of y and W_O.

    y: (nh·hd,) the heads side by side entering W_O; o: (d,) W_O's output (post-norm families);
    attn_added: (d,) what the stream received from attention."""
    import torch

    W, b = w_o  # (d, nh·hd), (d,) or None
    if y is None or W.shape[1] != nh * hd:
        return None
    d = W.shape[0]
    parts = torch.einsum("dnh,nh->nd", W.view(d, nh, hd), y.view(nh, hd).to(W.dtype)
                         )  # (nh, d): what each head writes through its columns of W_O
    bias = b
    fam = lm.parts.family
    if fam.attn_added:  # the post-norm, frozen at its actual input o = Σ parts + b
        centre, gain, nb = frozen_norm(lm.parts.attn_adds[layer], o, fam.norm_type)
        gain, nb = gain.to(parts.dtype), None if nb is None else nb.to(parts.dtype)
        parts = through_frozen(parts, centre, gain)
        bias = None if b is None else through_frozen(b, centre, gain)
        if nb is not None:
            bias = nb if bias is None else bias + nb
    added = parts.sum(dim=0) + (bias if bias is not None else 0)  # (d,)
    rtol = RTOL if dtype == "float32" else HALF_RTOL
    scale = float(attn_added.abs().max())
    if float((added - attn_added).abs().max()) > rtol * max(scale, 1.0):
        return None
    return parts, bias


