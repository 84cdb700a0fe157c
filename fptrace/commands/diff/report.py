"""The report's `diff --deep` section: the prompt on a second model, dtype or quantization."""

from __future__ import annotations

import html
from typing import Annotated, Any

import typer

from fptrace.cli.options import STATS
from fptrace.cli.sections import Page, ReportSection
from fptrace.render.html import section

OPTIONS = (
    ("model_b", Annotated[str | None, typer.Option(
        "--model-b", help="Also a `diff --deep` section: the prompt on this model too.",
        rich_help_panel=STATS)], None),
    ("dtype_b", Annotated[str | None, typer.Option(
        "--dtype-b", help="... or in this dtype.", rich_help_panel=STATS)], None),
    ("quantize_b", Annotated[str | None, typer.Option(
        "--quantize-b", help="... or quantized on load (int8, int4).",
        rich_help_panel=STATS)], None),
)


def _compute(page: Page, values: dict[str, Any]) -> Any:
    import dataclasses

    settings_b = {k: v for k, v in (("model", values["model_b"]), ("dtype", values["dtype_b"]),
                                    ("quantize", values["quantize_b"])) if v is not None}
    if not settings_b:
        return None
    from fptrace.cli.io import load
    from fptrace.commands.diff.deep import deep_diff

    return deep_diff(page.lm, load(dataclasses.replace(page.opts, **settings_b)), page.prompt)


def _body(against: Any) -> list[str]:
    from fptrace.commands.diff.render import deep_figure, diff_view

    side = (f"{against.b.model} ({against.b.dtype}" + (f", {against.b.quantization} "
            "weight-only" if against.b.quantization else "") + ")")
    return section(f"Where two runs part: against {html.escape(side)}, point by point",
                   "relative difference at every point of every block",
                   deep_figure(against)[0] if against.deep.blocks else None,
                   diff_view(against, 130))


SECTION = ReportSection(order=50, compute=_compute, body=_body, options=OPTIONS)
