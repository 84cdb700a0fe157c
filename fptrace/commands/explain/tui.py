"""explain in `fptrace tui`: the heads tab (one head's attention weights), the explain tab (the
walkthrough of the selected block) and the keys that switch heads."""

from __future__ import annotations

from typing import Any

from fptrace.cli.actions import TuiAction, TuiPane

BLOCKS = " ░▒▓█"


def heatmap(m: Any) -> Any:
    """One head's attention weights as unicode blocks (rows: queries, columns: keys)."""
    from rich.table import Table
    from rich.text import Text

    from fptrace.render.text import visible

    t = Table(title=f"head {m.head}: attention weights (row: query, column: key)",
              title_justify="left", box=None, padding=(0, 0), show_header=True)
    labels = [visible(x)[:6] for x in m.labels]
    t.add_column("", no_wrap=True, style="bold")
    for lab in labels:
        t.add_column(lab, no_wrap=True, justify="center")
    for lab, row in zip(labels, m.rows):
        cells = []
        for v in row:
            level = min(len(BLOCKS) - 1, int(round(max(v, 0.0) * (len(BLOCKS) - 1))))
            cells.append(Text(BLOCKS[level] * 3, style=f"rgb({int(60 + 195 * v)},90,200)"))
        t.add_row(lab, *cells)
    return t


def explained(app: Any) -> Any:
    """The walkthrough of the selected block and head (kept until either changes)."""
    from fptrace.commands.explain.core import explain

    block = max(app.layer - 1, 0)
    e = app.explanation
    if e is None or e.layer != block or e.head != app.head:
        app.explanation = explain(app.lm, app.traced, layer=block, head=app.head,
                                  all_heads=True, max_matrix=24)
    return app.explanation


def _heads(app: Any) -> Any:
    from rich.console import Group
    from rich.text import Text

    from fptrace.errors import FptraceError

    try:
        e = explained(app)
    except FptraceError as err:
        return Text(str(err), style="yellow")
    m = next(m for m in e.head_weights if m.head == app.head)
    note = "" if app.layer else " (the embedding row: block 0's heads)"
    return Group(Text(f"block {e.layer}{note}; h / H: another head", style="bold"), heatmap(m))


def _explain(app: Any) -> Any:
    from rich.text import Text

    from fptrace.commands.explain.render import explain_view
    from fptrace.errors import FptraceError

    try:
        return explain_view(explained(app), 80)
    except FptraceError as err:
        return Text(str(err), style="yellow")


def _next_head(step: int) -> Any:
    def run(app: Any) -> None:
        if app.trace is None:
            return
        app.head = (app.head + step) % app.trace.model.n_heads
        app.show_tab("heads")

    return run


ACTIONS = (TuiAction(10, "h", "Next head", _next_head(1)),
           TuiAction(11, "H", "Prev head", _next_head(-1), show=False))
PANES = (TuiPane(20, "heads", _heads), TuiPane(30, "explain", _explain))
