"""Small text helpers shared by the renderers."""

from __future__ import annotations

import math
from typing import Any

_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}
_EIGHTHS = " ▏▎▍▌▋▊▉█"


def visible(text: str) -> str:
    """Token text with whitespace made visible and other control characters escaped."""
    out = []
    for ch in text:
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out) or "∅"


def inert(text: str) -> str:
    """Text as a line of prose shows it: spaces as they are, every other character that is not
    printable (controls, line breaks, right-to-left overrides and other format characters,
    which would reorder what follows them) written as its escape (`\\u202e`), as the terminal
    shows it."""
    return "".join(ch if ch == " " or ch.isprintable() else
                   ch.encode("unicode_escape").decode("ascii") for ch in text)


def bullets(notes: tuple[str, ...] | list[str]) -> Any:
    """Notes as bullet lines: the random-weights warning in bold red, the others dim."""
    from rich.text import Text

    text = Text()
    for n in notes:
        text.append("• " + n + "\n", style="bold red" if n.startswith("RANDOM") else "dim")
    return text


def bar(value: float | None, top: float, width: int = 12) -> str:
    """A horizontal bar, value/top of `width` cells, drawn in eighths of a cell."""
    if value is None or not math.isfinite(value) or not math.isfinite(top) or top <= 0:
        return ""
    cells = max(0.0, min(1.0, value / top)) * width
    full = int(cells)
    rest = int(round((cells - full) * 8))
    if rest == 8:
        full, rest = full + 1, 0
    return "█" * full + (_EIGHTHS[rest] if rest and full < width else "")


def num(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "—"
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return f"{x:.{digits}f}"


def shape(s: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in s) + ")"


def norm(x: float | None) -> str:
    """A norm in at most 6 characters: 2 decimals below 100, 1 below 10,000, then none."""
    if x is None or not math.isfinite(x):
        return num(x)
    a = abs(x)
    return f"{x:.2f}" if a < 100 else f"{x:.1f}" if a < 10_000 else f"{x:.0f}"


def compact(x: float | None) -> str:
    """A value of any size in a few characters: thousands separated from 1,000, one decimal from
    100, two from 1, three significant digits below."""
    if x is None or not math.isfinite(x):
        return num(x)
    a = abs(x)
    return f"{x:,.0f}" if a >= 1000 else f"{x:.1f}" if a >= 100 else f"{x:.2f}" if a >= 1 \
        else f"{x:.3g}"


def duration(seconds: float) -> str:
    """A short time as people write it: 85 µs, 1.2 ms, 3.4 s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.1f} s"
