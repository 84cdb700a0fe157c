"""`fptrace report`."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fptrace.cli.io import Group, command, load_for, stderr_console
from fptrace.cli.options import (
    OUTPUT,
    ChatOptions,
    ForceOpt,
    LoadOptions,
    chat_options,
    model_options,
)
from fptrace.cli.sections import section_options


@command(order=90, group=Group.pages, docs="report",
         examples=('fptrace report "The capital of France is" --out report.html',))
@chat_options()
@model_options(placement=False)
@section_options()
def report(
    out: Annotated[str, typer.Option("--out", "-o", help="The .html file to write.",
                                     rich_help_panel=OUTPUT)],
    prompt: Annotated[str | None, typer.Argument(
        help="The text to trace (or --messages FILE).")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
    force: ForceOpt = False,
    values: dict[str, Any] | None = None,
) -> None:
    """One offline HTML page: tables, figures, walkthrough.

    One self-contained HTML file: the run tables, the figures, the explain walkthrough of
    one layer, the attribution of the top-1, why one head attends where it does (and with
    --noise, causal tracing) and the JSON trace. It makes no network request and opens offline."""
    from fptrace.cli.sections import Page, collect, compute
    from fptrace.commands.report.core import check_out, write_report
    from fptrace.core.trace import run_trace
    from fptrace.render.page import build_html

    values = values or {}
    check_out(out, force)
    for _, section in collect():
        section.check(values)
    lm, prompt = load_for(prompt, opts, chat=chat)
    page = Page(lm, prompt, opts, run_trace(lm, prompt, lens_grid=True))
    parts = compute(page, values)
    write_report(out, build_html(page.trace, parts))
    stderr_console().print(f"wrote {out}", markup=False, soft_wrap=True)
    for section, result in parts:
        section.verify(result)
