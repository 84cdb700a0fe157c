"""What a command folder's tui.py offers `fptrace tui`: keys and panes.

commands/<name>/tui.py may define, each optional:

    ACTIONS  a tuple of TuiAction: a key, its label in the footer (shown or not), the function it
             runs (given the app), and the hint the layer pane shows for it
    PANES    a tuple of TuiPane: a part of one of the app's tabs (several folders may add to the
             same tab), computed from the app's state when the tab is on screen

The app (commands/tui/app.py) has its own keys and tabs of the same types; it merges the
folders' by their order and names none of them. The app's state the functions read: lm, traced
(the prepared prompt), trace, layer (the selected row: 0 embedding, k + 1 block k), head,
target (an index into the trace's top-k), and whatif(compute, view, done), which runs a what-if
and shows it under the layer pane.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TuiAction:
    """A key of the app."""

    order: int  # its place among the app's keys (the footer's order), smallest first
    key: str  # Textual's name of the key: "a", "H", "slash", "question_mark"
    label: str  # the footer's label
    run: Callable[[Any], None]  # run(app)
    show: bool = True  # shown in the footer
    hint: str | None = None  # "a: remove this block's head and MLP" under the layer pane
    computes: bool = True  # computes with the model (waits while a worker holds it)


@dataclass(frozen=True)
class TuiPane:
    """A part of one tab: show(app) returns the renderable (a rich object)."""

    order: int  # the tab's place among the tabs (the first part's order counts), smallest first
    tab: str  # the tab it is part of
    show: Callable[[Any], Any]


def collect(kind: str) -> list[Any]:
    """The ACTIONS or PANES of every commands/<name>/tui.py, by order (then folder name)."""
    from fptrace.extensions import declared

    want = {"ACTIONS": TuiAction, "PANES": TuiPane}[kind]
    found = [(item.order, name, item) for name, items in declared("tui", kind)
             for item in items]
    for _, name, item in found:
        if not isinstance(item, want):
            raise RuntimeError(f"fptrace/commands/{name}/tui.py: {kind} holds {item!r}, not a "
                               f"{want.__name__} (cli/actions.py)")
    return [item for _, _, item in sorted(found, key=lambda t: (t[0], t[1]))]
