"""`fptrace attribute --qk L.H`: why a head attends where it does, in terms that sum exactly.

The split itself (the parts of the two streams, the terms, the checks against the model) is
fptrace/core/qk.py's, which `graph --qk` shares; this module resolves the head and the
positions, and makes the split a QKAttribution with its notes. A check that fails makes the
result not ok (exit 5 on the command line).
"""

from __future__ import annotations

from fptrace.addresses import Head, Position, resolve_head, resolve_position
from fptrace.commands.attribute.notes import QK_KEY_DEFAULTED, QK_SOFTCAP
from fptrace.commands.attribute.result import Attribution, QKAttribution
from fptrace.core.qk import split_score
from fptrace.core.trace import base_notes, model_info, sizes
from fptrace.errors import BadInput, UnsupportedModel, param
from fptrace.models.loading import LoadedModel
from fptrace.models.prompts import Prompt

GROUPS = ("term", "source")


def top_head(attribution: Attribution) -> Head | None:
    """The head whose direct contribution to an Attribution is largest, or None when no block
    was split per head."""
    heads = [(c.layer, c.head, c.value) for c in attribution.contributions
             if c.component == "attn_head" and c.layer is not None and c.head is not None]
    best = max(heads, key=lambda c: abs(c[2]), default=None)
    return None if best is None else Head(best[0], best[1])


def qk_request(qk: Head | None, query: object, key: object, group: str,
               target: str | None = None, versus: str | None = None) -> None:
    """BadInput for options that do not go with --qk (or that need it), checked before the
    model loads."""
    if qk is None:
        if query is not None or key is not None or group != "term":
            raise BadInput(f"{param('query')}, {param('key')} and {param('group')} go with "
                           f"{param('qk')} LAYER.HEAD")
        return None
    if target is not None or versus is not None:
        raise BadInput(f"{param('qk')} splits an attention score; {param('target')} and "
                       f"{param('versus')} choose a logit "
                       "to attribute: use one or the other")
    if group not in GROUPS:
        raise BadInput(f"{param('group')} must be one of {', '.join(GROUPS)} (got {group!r})")
    return None


def attribute_qk(lm: LoadedModel, prompt: Prompt, head: Head, *,
                 query: int | Position | None = None, key: int | Position | None = None,
                 top: int = 12, group: str = "term") -> QKAttribution:
    """Split the attention score of `head` (`Head(layer, head)`; negative numbers count from
    the end) at query position `query` (default: the last) on key position `key` (default: the
    position it attends to most) into query-part × key-part terms that sum to the model's
    score."""
    fam = lm.parts.family
    if fam.qk_weights is None:
        raise UnsupportedModel(f"attribute {param('qk')} needs the {fam.name} family's record of "
                               f"where "
                               "the norm before attention and W_Q, W_K are; it has none")
    if lm.tensor_parallel > 1:
        raise UnsupportedModel(f"attribute {param('qk')} does not run on tensor-parallel ranks "
                               f"yet; "
                               f"load the model on one device (or with {param('device_map')})")
    info = model_info(lm)
    chosen = resolve_head(head, sizes(lm), "head")
    if top < 1:
        raise BadInput(f"{param('top')} must be at least 1")
    if group not in GROUPS:
        raise BadInput(f"{param('group')} must be one of {', '.join(GROUPS)} (got {group!r})")
    prepared = lm.prepare(prompt)
    ids = list(prepared.ids)
    T = len(ids)
    i = T - 1 if query is None else resolve_position(query, T, "query")
    j = None if key is None else resolve_position(key, T, "key")
    s = split_score(lm, ids, chosen.layer, chosen.head, i, j, top)
    notes = base_notes(lm) + list(s.notes)
    if key is None:
        notes.append(QK_KEY_DEFAULTED(query=i))
    if s.softcap:
        notes.append(QK_SOFTCAP(cap=s.softcap))
    return QKAttribution(
        prompt=prepared.text, model=info, tokens=lm.tokens(prepared), layer=s.layer,
        head=s.head, kv_head=s.kv_head, query=s.query, key=s.key,
        most_attended=s.most_attended, scale=s.scale, score=s.score,
        stream_score=s.stream_score, difference=s.score - s.stream_score, softcap=s.softcap,
        capped_score=s.capped_score, window=s.window, weight=s.weight,
        recomputed_weight=s.recomputed_weight, n_terms=s.n_terms, top=s.top, rest=s.rest,
        query_parts=s.query_parts, key_parts=s.key_parts, grid_rows=s.grid_rows,
        grid_columns=s.grid_columns, grid=s.grid, checks=s.checks, ok=s.ok, group=group,
        notes=tuple(notes))
