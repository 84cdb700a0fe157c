"""`--html FILE`: the interactive page (render/page.py) of one command's result, written where
the one output policy allows (atomic.check_target, as the report's --out), beside the trace of
the same prompt with its logit-lens grid. The command names its own report section
(cli/sections.py); the sections whose result is the trace itself come with every page."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from fptrace.errors import BadInput

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel
    from fptrace.models.prompts import Prompt
    from fptrace.results import Trace


def check_page(path: str, option: str = "--html", force: bool = False) -> None:
    """Before any work: the path may be written (atomic.check_target) and is an .html file."""
    from fptrace.atomic import check_target

    check_target(path, option, "report.html", force)
    if os.path.splitext(path)[1].lower() not in (".html", ".htm"):
        raise BadInput(f"{option} {path}: a report is an .html file")


def write_page(path: str | None, lm: LoadedModel, prompt: Prompt, name: str, result: Any,
               trace: Trace | None = None) -> None:
    """Write the page of `result`, the result of command `name`'s report section, with the
    trace of `prompt` (traced here, with its lens grid, unless `trace` already has one);
    nothing where `path` is None (no --html)."""
    if path is None:
        return
    from rich.console import Console

    from fptrace.atomic import write_text_atomic
    from fptrace.cli.sections import collect
    from fptrace.render.page import build_html

    if trace is None or not trace.lens_grid:
        from fptrace.core.trace import run_trace

        trace = run_trace(lm, prompt, lens_grid=True)
    parts = [(s, trace if s.trace else result) for n, s in collect() if s.trace or n == name]
    write_text_atomic(path, build_html(trace, parts), ".html")
    # cli/io.py checks --html through check_page: this module prints without it (no cycle)
    Console(stderr=True, highlight=False).print(f"wrote {path}", style="dim", markup=False,
                                                soft_wrap=True)
