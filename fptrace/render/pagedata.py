"""What a report section offers the page's script besides its figures and terminal view: heatmaps
whose every cell shows its exact value when hovered, and details of a block shown when the
block is opened. A section's report.py builds them from its typed result (cli/sections.py's
`data`); render/page.py embeds them as JSON and names no section."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Heatmap:
    """A grid of numbers drawn as cells, each showing its row, column and value when hovered."""

    title: str  # what the grid shows
    value: str  # what one value is, e.g. "p(target)" or "Δ logit"
    rows: tuple[str, ...]  # a label per row
    columns: tuple[str, ...]  # a label per column
    values: tuple[tuple[float | None, ...], ...]  # rows × columns; None: no value there
    blocks: tuple[int | None, ...] = ()  # the block each row is (a click opens it), or none
    diverging: bool = False  # colours centred on 0 (signed values)
    # rows × columns of what a cell shows instead of its value (e.g. a head's roles); () none
    labels: tuple[tuple[str, ...], ...] = ()
    # rows × columns of more lines its hover shows (every score behind a label); () none
    tips: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class BlockDetail:
    """Lines shown when block `block` is opened: (label, value) pairs, a value a number or text."""

    block: int
    title: str
    rows: tuple[tuple[str, float | str | None], ...]


@dataclass(frozen=True)
class SectionData:
    """One section's part of the page's script."""

    title: str
    heatmaps: tuple[Heatmap, ...] = ()
    blocks: tuple[BlockDetail, ...] = ()
