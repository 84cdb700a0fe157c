"""What a report section offers the page's script besides its figures and terminal view: heatmaps
whose every cell shows its exact value when hovered, details of a block shown when the
block is opened, and node-link drawings (pagegraph.js draws them as inline SVG). A section's
report.py builds them from its typed result (cli/sections.py's `data`); render/page.py embeds
them as JSON and names no section."""

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
class LogitEffect:
    """What a drawn node does to one output node: its direct edge and its influence."""

    node: str  # the output node's id
    edge: float  # the direct edge into it (0: none)
    influence: float  # the influence on it alone


@dataclass(frozen=True)
class DrawnNode:
    """One node of a drawing: a circle at (its position, its row), sized by its size."""

    id: str
    label: str  # what it is, in words (its circle's title)
    kind: str  # its style: "token", "node", "remainder", "error" or "output"
    row: int  # its row, 0 the bottom (the tokens)
    position: int  # its column
    size: float  # the circle's area grows with it (the node's influence)
    info: str  # the first line of its hover and its panel (its type, value, influence)
    activations: tuple[float, ...] = ()  # its value at every column (click: a shaded row)
    effects: tuple[LogitEffect, ...] = ()  # what it does to each output node (click)


@dataclass(frozen=True)
class NodeGraph:
    """A node-link drawing: rows × columns, nodes as circles, edges as curves coloured by sign,
    the strongest `shown` drawn until more are asked for; hovering a node highlights its edges
    (all of them) and lists them, clicking it shows its activations and its effects."""

    title: str
    rows: tuple[str, ...]  # a label per row, bottom first
    columns: tuple[str, ...]  # a label per column (the prompt's tokens)
    nodes: tuple[DrawnNode, ...]
    edges: tuple[tuple[str, str, float], ...]  # (source id, target id, weight), strongest first
    shown: int  # how many edges are drawn before any is asked for
    kinds: tuple[tuple[str, str], ...] = ()  # (kind, what it is in words): the legend


@dataclass(frozen=True)
class SectionData:
    """One section's part of the page's script."""

    title: str
    heatmaps: tuple[Heatmap, ...] = ()
    blocks: tuple[BlockDetail, ...] = ()
    graphs: tuple[NodeGraph, ...] = ()
