"""`fptrace attribute`: direct logit attribution that sums exactly to the model's own logit.

The engine (the last position's stream taken apart, the final norm frozen, the heads split
through W_O) is core/attribution.py, which `ablate` shares; this module turns its parts into
the command's result: the largest contributions, the per-block sums, the head grid and the
check that the parts sum to the model's logit (exit 5 when they do not).
"""

from __future__ import annotations

from collections.abc import Callable

from fptrace.commands.attribute.notes import SOFTCAP
from fptrace.commands.attribute.result import Attribution, Contribution, LayerAttribution
from fptrace.core.attribution import MLP_PARTS, DirectLogits, direct_logits
from fptrace.core.trace import base_notes, model_info, ranked_token
from fptrace.errors import as_parameter
from fptrace.models.loading import LoadedModel
from fptrace.models.prompts import Prompt


def attribute(lm: LoadedModel, prompt: Prompt, *, target: str | None = None,
              versus: str | None = None, top: int = 12,
              named: Callable[[str], str] = as_parameter) -> Attribution:
    """Direct logit attribution of the target token's logit at the last position (default:
    the model's top-1), or of the logit difference target − versus. `named`: how an error
    names a parameter (the CLI: its flag)."""
    return attribution(direct_logits(lm, prompt, target=target, versus=versus, named=named),
                       top)


def attribution(d: DirectLogits, top: int = 12) -> Attribution:
    """The result of `fptrace attribute` from a prompt taken apart."""
    lm = d.lm
    info = model_info(lm)
    t, v = d.target, d.versus
    absolute = sum(abs(p[3]) for p in d.parts) or 1.0
    contributions = tuple(Contribution(
        component=k, layer=l, head=None if k == "expert" else i, value=val,
        share=val / absolute, expert=i if k == "expert" else None) for k, l, i, val in d.parts)
    per_layer = tuple(LayerAttribution(
        layer=l, attn=sum(c.value for c in contributions if c.layer == l and
                          c.component.startswith("attn")),
        mlp=sum(c.value for c in contributions if c.layer == l and c.component in MLP_PARTS))
        for l in range(info.n_layers))
    head_grid = []
    for l in range(info.n_layers):
        heads = [c for c in contributions if c.layer == l and c.component == "attn_head"]
        head_grid.append(tuple(c.value for c in heads))
    notes = list(d.notes)
    capped = lm.parts.final_softcap is not None
    if capped:
        notes.append(SOFTCAP(cap=lm.parts.final_softcap))
    notes = base_notes(lm) + notes
    top_parts = tuple(sorted(contributions, key=lambda c: -abs(c.value))[:top])
    logits = d.logits
    return Attribution(
        prompt=d.prepared.text, model=info, tokens=lm.tokens(d.prepared),
        target=ranked_token(lm, logits, t),
        versus=None if v is None else ranked_token(lm, logits, v),
        model_logit=d.model_logit,
        capped_logit=float(logits[t] - (logits[v] if v is not None else 0)) if capped else None,
        total=d.total, difference=d.difference, tolerance=d.tolerance, ok=d.ok,
        contributions=contributions, top=top_parts, layers=per_layer,
        head_grid=tuple(head_grid), notes=tuple(notes))
