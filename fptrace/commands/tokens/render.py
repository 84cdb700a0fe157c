"""The table of `fptrace tokens`."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from fptrace.commands.tokens.result import Tokenization
from fptrace.render.fit import Col, fit_table
from fptrace.render.text import bullets, inert, visible

COLS = (Col("pos", 0, "right"), Col("id", 0, "right"), Col("piece", 1), Col("text", 0),
        Col("special", 2), Col("bytes", 3, "right"))


def tokens_view(r: Tokenization, width: int | None = None) -> RenderableType:
    rows = [[str(t.position), str(t.id), Text(visible(t.piece)) if t.piece is not None else "—",
             Text(visible(t.text)), "special" if t.special else "",
             f"{t.start}–{t.end}" if t.start is not None else "—"] for t in r.tokens]
    what = f"{len(r.tokens)} ids given" if r.from_ids else \
        f"{inert(repr(r.text))[:80]} → {len(r.tokens)} tokens"
    title = Text(f"{r.model} ({r.tokenizer}, vocabulary {r.vocab_size:,}): {what}",
                 style="bold")
    cols = COLS[:-1] if r.from_ids else COLS  # ids given have no offsets in a text
    parts: list[RenderableType] = [title, fit_table(cols, [row[:len(cols)] for row in rows],
                                                    width)]
    if r.from_ids:
        parts.append(Text("decoded: " + inert(repr(r.decoded)), style="dim"))
    if r.notes:
        parts.append(bullets(r.notes))
    return Group(*parts)
