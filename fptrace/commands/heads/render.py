"""The terminal view of `fptrace heads`: the blocks × heads grid of roles (80 columns), --wide
the scores of every head, --head one head's scores with the positions that made them."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from fptrace.commands.heads.result import Heads, HeadScores
from fptrace.render.fit import Col, fit_table
from fptrace.render.tables import check_lines, header
from fptrace.render.text import bullets, num, visible

LETTER = {"previous-token": "P", "induction": "I", "duplicate-token": "D", "subject": "S",
          "sink": "s"}
STYLE = {"P": "bold cyan", "I": "bold magenta", "D": "bold yellow", "S": "bold green",
         "s": "dim"}


def cell(h: HeadScores) -> str:
    """A head's roles as letters (P I D S s), a pattern-only role as its letter and `?`; `·`
    for none."""
    text = "".join(LETTER[r] for r in h.roles) + "".join(LETTER[r] + "?"
                                                         for r in h.pattern_only)
    return text or "·"


def summary(r: Heads) -> Text:
    t = Text(f"{len(r.heads)} heads, scored over {r.prompts} prompt(s)"
             + (f" and {r.induction_sequences} sequences of {r.induction_length} random tokens "
                f"repeated once (seed {r.seed})" if r.induction_sequences else ""), style="bold")
    if r.clean_loss is not None:
        t.append(f"\nloss on the repeated half, nothing removed: {r.clean_loss:.3f} nats")
    t.append("\nP previous-token  I induction  D duplicate-token  S subject  s sink (first "
             "token);  X? pattern only: the score clears its threshold, the check disagrees "
             "(docs/heads.md)")
    return t


def grid(r: Heads, width: int | None) -> RenderableType:
    H = max((h.head for h in r.heads), default=-1) + 1
    cols = [Col("block", 0, "right")] + [Col(f"h{h}", 0) for h in range(H)]
    rows: list[list[Any]] = []
    for h in r.heads:
        if h.head == 0:
            rows.append([str(h.layer)])
        c = cell(h)
        rows[-1].append(Text(c, style=STYLE.get(c[0], "")))
    return fit_table(cols, rows, width, title="Roles, blocks × heads", title_justify="left")


SCORE_COLS = (Col("head", 0), Col("roles", 0, wrap=True), Col("prev", 0, "right"),
              Col("dup", 0, "right"), Col("ind", 0, "right"), Col("first", 0, "right"),
              Col("subj", 1, "right"), Col("copy", 1, "right"), Col("eig", 1, "right"),
              Col("Δloss", 1, "right"), Col("next×", 1, "right"))


def _row(h: HeadScores) -> list[Any]:
    return [f"{h.layer}.{h.head}", cell(h), num(h.previous), num(h.duplicate), num(h.induction),
            num(h.first), num(h.subject), num(h.copying), num(h.eigen), num(h.loss_change, 3),
            num(h.next_share)]


def scores(r: Heads, width: int | None, only: str | None = None) -> RenderableType:
    rows = [_row(h) for h in r.heads if only is None or f"{h.layer}.{h.head}" == only]
    return fit_table(SCORE_COLS, rows, width, title="Scores (docs/heads.md: prev, dup, ind, "
                     "first, subj: shares of attention; copy, eig: the OV circuit; Δloss, "
                     "next×: the checks)", title_justify="left")


def evidence(r: Heads, width: int | None) -> RenderableType:
    cols = (Col("pattern: prompt", 0, wrap=True), Col("query", 0, "right"), Col("", 0),
            Col("key", 0, "right"), Col(" ", 0), Col("weight", 0, "right"))
    rows = [[Text(visible(e.prompt)), str(e.query), Text(visible(e.query_text)), str(e.key),
             Text(visible(e.key_text)), f"{e.weight:.3f}"] for e in r.evidence]
    return fit_table(cols, rows, width, title=f"Head {r.focus}: the positions that made its "
                     "scores (largest weight first)", title_justify="left")


def role_text(h: HeadScores) -> str:
    """A head's roles in words: `previous-token, sink`; a pattern-only role with `(pattern
    only)`; `no role`."""
    words = [*h.roles, *(f"{r} (pattern only)" for r in h.pattern_only)]
    return ", ".join(words) or "no role"


def score_lines(h: HeadScores) -> list[str]:
    """Every score of one head, one per line, and what each check measured (the report's
    hover, the TUI's pane)."""
    return [f"roles: {role_text(h)}",
            f"previous-token {num(h.previous, 3)}  duplicate-token {num(h.duplicate, 3)}  "
            f"induction {num(h.induction, 3)}",
            f"first-token {num(h.first, 3)}  subject {num(h.subject, 3)}",
            f"OV copying {num(h.copying, 3)}  OV eigen {num(h.eigen, 3)}",
            "removed: repeated-half loss " + ("not checked" if h.loss_change is None else
                                              f"{h.loss_change:+.3f} nats"),
            "a token replaced: next-position share " + ("not checked" if h.next_share is None
                                                        else f"{h.next_share:.2f}×")]


def head_pane(h: HeadScores) -> Text:
    """One head's role and scores (the TUI's heads tab)."""
    t = Text(f"\nHead {h.layer}.{h.head}: ", style="bold")
    c = cell(h)
    t.append(role_text(h), style=STYLE.get(c[0], "") if h.roles else "")
    for line in score_lines(h)[1:]:
        t.append("\n" + line)
    return t


def heads_view(r: Heads, width: int | None = 80, wide: bool = False) -> RenderableType:
    parts: list[Any] = [header(r.model), summary(r)]
    if r.focus is not None:
        parts += [scores(r, width, r.focus), evidence(r, width)]
    else:
        parts.append(grid(r, width))
        if wide:
            parts.append(scores(r, width))
    parts += [bullets(r.story), bullets(r.notes),
              check_lines(r.checks, "THE HEAD SCORES DO NOT CHECK OUT")]
    return Group(*parts)


__all__ = ["cell", "head_pane", "heads_view", "role_text", "score_lines"]
