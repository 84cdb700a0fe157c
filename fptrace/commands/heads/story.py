"""The story of the grid: one sentence per role, and each of the walkthrough's claims about
where a role sits held against it (the notes of notes.py; docs/heads.md)."""

from __future__ import annotations

from collections.abc import Sequence

from fptrace.addresses import Head
from fptrace.commands.heads.notes import (
    HEADS_CLAIM,
    HEADS_CLAIM_UNTESTED,
    HEADS_PATTERN_ONLY,
    HEADS_ROLE,
    HEADS_ROLE_NONE,
    HEADS_UNCHECKED,
)
from fptrace.commands.heads.result import HeadScores
from fptrace.core.trace import row_ranges

CHECKED = {"previous-token": "checked", "induction": "checked", "sink": "the sinks of stats"}
WHY = {"induction": "removing it does not raise the loss on the repeated half",
       "previous-token": "replacing a token does not change its output at the next position "
       "more than later"}
# the walkthrough's claims: (role, where it says, the blocks that are that: a function of L)
CLAIMS = (("previous-token", "early", "the first quarter", lambda L: range(0, max(1, L // 4))),
          ("subject", "middle", "the middle half", lambda L: range(L // 4, max(L // 4 + 1,
                                                                               3 * L // 4))))


def _blocks(heads: Sequence[Head]) -> str:
    return row_ranges(sorted({h.layer for h in heads}))


def _listed(hs: Sequence[Head], most: int = 12) -> str:
    shown = ", ".join(map(str, hs[:most]))
    return shown + (f" and {len(hs) - most} more" if len(hs) > most else "")


def story(rows: Sequence[HeadScores], L: int, checked: bool = True) -> list[str]:
    from fptrace.commands.heads.roles import ROLES, THRESHOLDS

    out = [] if checked else [HEADS_UNCHECKED()]
    having = {role: [Head(r.layer, r.head) for r in rows if role in r.roles]
              for role in (*ROLES, "sink")}
    for role in (*ROLES, "sink"):
        hs = having[role]
        mark = CHECKED.get(role, "pattern alone") if checked or role == "sink" else \
            "pattern alone"
        if hs:
            out.append(HEADS_ROLE(n=len(hs), role=role, s="" if len(hs) == 1 else "s",
                                  threshold=THRESHOLDS[role], how=mark,
                                  are="is" if len(hs) == 1 else "are",
                                  blocks=_blocks(hs), heads=_listed(hs)))
        else:
            out.append(HEADS_ROLE_NONE(role=role, threshold=THRESHOLDS[role], how=mark))
        only = [Head(r.layer, r.head) for r in rows if role in r.pattern_only]
        if only:
            out.append(HEADS_PATTERN_ONLY(heads=", ".join(map(str, only)), role=role,
                                          threshold=THRESHOLDS[role], why=WHY[role]))
    for role, where, span, blocks in CLAIMS:
        hs = having[role]
        if not hs:
            out.append(HEADS_CLAIM_UNTESTED(role=role, where=where))
            continue
        inside = sum(h.layer in blocks(L) for h in hs)
        span_txt = f"{span} ({row_ranges(list(blocks(L)))})"
        out.append(HEADS_CLAIM(role=role, where=where, k=inside, n=len(hs), span=span_txt,
                               verdict="agrees" if 2 * inside > len(hs) else "disagrees"))
    return out


__all__ = ["CLAIMS", "story"]
