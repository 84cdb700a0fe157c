"""run in `fptrace tui`: the key that exports the trace's figure."""

from __future__ import annotations

from typing import Any

from fptrace.cli.actions import TuiAction


def _export_png(app: Any) -> None:
    from fptrace.commands.run.render import trace_figure
    from fptrace.core.trace import run_trace
    from fptrace.render.figures import save

    if app.trace is not None:
        save(trace_figure(run_trace(app.lm, app.traced, lens_grid=True))[0],
             "fptrace-trace.png")
        app.status("wrote fptrace-trace.png")


ACTIONS = (TuiAction(70, "p", "PNG", _export_png),)
