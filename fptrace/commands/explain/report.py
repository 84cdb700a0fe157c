"""The report's walkthrough of one block, and the options that choose it."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fptrace.cli.options import STATS
from fptrace.cli.sections import Page, ReportSection
from fptrace.render.html import png, terminal

OPTIONS = (
    ("layer", Annotated[int, typer.Option("--layer", "-l", help="The block the walkthrough "
                                          "recomputes.", rich_help_panel=STATS)], 0),
    ("head", Annotated[int, typer.Option("--head", help="The head whose matrix the walkthrough "
                                         "shows.", rich_help_panel=STATS)], 0),
)


def _compute(page: Page, values: dict[str, Any]) -> Any:
    from fptrace.commands.explain.core import covered, explain

    covered(page.lm.parts.family)
    return explain(page.lm, page.prompt, layer=values["layer"], head=values["head"],
                   all_heads=True)


def _figures(e: Any) -> list[str]:
    from fptrace.commands.explain.render import attention_figure

    return [f'<img alt="attention of every head at block {e.layer}" '
            f'src="{png(attention_figure(e)[0])}">']


def _body(e: Any) -> list[str]:
    from fptrace.commands.explain.render import explain_view

    verdict = ('<p class="verdict-ok">The recomputed block matches the model.</p>'
               if e.match else
               '<p class="verdict-bad">THE RECOMPUTATION DOES NOT MATCH THE MODEL.</p>')
    return [f"<h2>Block {e.layer}, step by step</h2>", verdict, terminal(explain_view(e))]


def _verify(e: Any) -> None:
    from fptrace.cli.io import check_match

    check_match(e.match, [c.name for c in e.checks if not c.ok])


SECTION = ReportSection(order=20, compute=_compute, figures=_figures, body=_body,
                        options=OPTIONS, verify=_verify)
