"""attribute in `fptrace tui`: the attribution tab, why the selected head attends where it does
(under the heads tab), and the key that attributes the next token of the top-k."""

from __future__ import annotations

from typing import Any

from fptrace.cli.actions import TuiAction, TuiPane


def _attribution(app: Any) -> Any:
    from rich.text import Text

    from fptrace.commands.attribute.core import attribute
    from fptrace.commands.attribute.render import attribution_view
    from fptrace.errors import FptraceError

    target = app.trace.top_k[app.target]
    try:
        app.attribution = attribute(app.lm, app.traced, target=f"#{target.id}", top=10)
    except FptraceError as e:
        return Text(str(e), style="yellow")
    return attribution_view(app.attribution, 80)


def _qk_split(app: Any) -> Any:
    """Why the selected head attends where it does (attribute --qk): the last position on its
    most attended key."""
    from rich.console import Group
    from rich.text import Text

    from fptrace.addresses import Head
    from fptrace.commands.attribute.qk import attribute_qk
    from fptrace.commands.attribute.render import qk_pane
    from fptrace.errors import FptraceError

    try:
        app.qk = attribute_qk(app.lm, app.traced, Head(max(app.layer - 1, 0), app.head),
                              top=6)
    except FptraceError as err:
        app.qk = None
        return Text(str(err), style="yellow")
    return Group(Text("\nWhy it attends there: its score, part by part", style="bold"),
                 qk_pane(app.qk, 60))


def _next_target(app: Any) -> None:
    from fptrace.render.text import visible

    if app.trace is None:
        return
    app.target = (app.target + 1) % len(app.trace.top_k)
    app.show_tab("attribution")
    app.status(f"attributing {visible(app.trace.top_k[app.target].text)!r}")


ACTIONS = (TuiAction(20, "t", "Target", _next_target),)
PANES = (TuiPane(25, "heads", _qk_split), TuiPane(40, "attribution", _attribution))
