"""The report's trace: its figure and its table, block by block."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fptrace.cli.sections import Page, ReportSection
from fptrace.render.html import png, terminal

if TYPE_CHECKING:
    from fptrace.results import Trace


def _figures(trace: Trace) -> list[str]:
    from fptrace.commands.run.render import trace_figure

    figure = png(trace_figure(trace)[0])
    return [f'<img alt="residual stream, logit lens and top-k" src="{figure}">']


def _body(trace: Trace) -> list[str]:
    from fptrace.commands.run.render import trace_view

    out = ["<h2>The forward pass, block by block</h2>", terminal(trace_view(trace, 130))]
    if trace.routing is not None and not trace.all_positions:  # a mixture of experts: the
        from fptrace.render.routing import top1_grid  # routing at every position too

        out.append(terminal(top1_grid(trace.routing, trace.tokens, 130)))
    return out


def _compute(page: Page, values: dict[str, Any]) -> Any:
    return page.trace  # every report traces the prompt (with the lens grid)


SECTION = ReportSection(order=10, compute=_compute, figures=_figures, body=_body, trace=True)
