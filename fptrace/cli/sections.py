"""A report section: what a command folder's report.py offers `fptrace report`.

commands/<name>/report.py defines SECTION = ReportSection(...): the options the report takes for
it (Typer options, shown in the report's --help), the check of those options before the model
is loaded, the computation (from the loaded model, the prompt and the results of the sections
before it; None: the options did not ask for the section), the HTML it adds (images to the
page's figures, parts to its body), optionally what the page's script shows of its result
(render/pagedata.py: heatmaps hoverable cell by cell, details of a block) and the checks that
set the exit code once the page is written. The report collects the sections of every folder, in their order on the page, and
names none of them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel
    from fptrace.models.options import LoadOptions
    from fptrace.models.prompts import Prompt
    from fptrace.results import Trace

# (name, Annotated[type, typer.Option(...)], default): the shape of cli/options.py's groups
Option = tuple[str, object, object]


@dataclass
class Page:
    """What the sections computed so far know: the loaded model, the prompt, the loading
    options, the trace every report holds, and each earlier section's result by name."""

    lm: LoadedModel
    prompt: Prompt
    opts: LoadOptions
    trace: Trace
    results: dict[str, Any] = field(default_factory=dict)


def _nothing(*_: object) -> None:
    return None


def _no_parts(_: object) -> list[str]:
    return []


@dataclass(frozen=True)
class ReportSection:
    """One command's part of the report (see the module's text)."""

    order: int  # its place on the page, smallest first
    compute: Callable[[Page, dict[str, Any]], Any]  # (page, option values) -> result or None
    body: Callable[[Any], list[str]]  # the HTML parts it adds to the page's body
    figures: Callable[[Any], list[str]] = _no_parts  # the <img>s it adds to the page's figures
    options: tuple[Option, ...] = ()
    check: Callable[[dict[str, Any]], None] = _nothing  # before loading: BadInput on bad values
    verify: Callable[[Any], None] = _nothing  # after the page is written: its own checks
    # what the page's script shows of the result: a render.pagedata.SectionData, a tuple of
    # them (a section that is several on the page: graph's --verify), or None
    data: Callable[[Any], Any] = _nothing
    trace: bool = False  # its result is the page's trace: it comes with every command's --html


def collect() -> list[tuple[str, ReportSection]]:
    """(command, SECTION) of every commands/<name>/report.py, in page order."""
    from fptrace.extensions import declared

    found = declared("report", "SECTION")
    for name, s in found:
        if not isinstance(s, ReportSection):
            raise RuntimeError(f"fptrace/commands/{name}/report.py: SECTION is not a "
                               "ReportSection (cli/sections.py)")
    return sorted(found, key=lambda item: (item[1].order, item[0]))


def section_options() -> Callable[[Callable[..., object]], Callable[..., object]]:
    """Attach every section's options to the report's function, which takes `values` (a dict of
    the options' values by name) instead: its Typer signature is built from what the folders
    offer."""

    def attach(fn: Callable[..., object]) -> Callable[..., object]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != "values"]
        chosen = [option for _, s in collect() for option in s.options]
        names = [name for name, _, _ in chosen]
        clash = {n for n in names if names.count(n) > 1 or n in sig.parameters}
        if clash:
            raise RuntimeError(f"report options defined twice: {', '.join(sorted(clash))}")
        added = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                   default=default, annotation=annotation)
                 for name, annotation, default in chosen]

        @functools.wraps(fn)
        def command(*args: object, **kwargs: object) -> object:
            values = {n: kwargs.pop(n) for n in names if n in kwargs}
            return fn(*args, values=values, **kwargs)

        params = own + added
        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return attach


def compute(page: Page, values: dict[str, Any]) -> list[tuple[ReportSection, Any]]:
    """Every section the options ask for, computed in page order (each sees the results of
    those before it in page.results), with its result."""
    out = []
    for name, section in collect():
        result = section.compute(page, values)
        if result is not None:
            page.results[name] = result
            out.append((section, result))
    return out


def defaults() -> dict[str, Any]:
    """Every section option at its default: the report of a prompt with no option given."""
    return {name: default for _, s in collect() for name, _, default in s.options}

