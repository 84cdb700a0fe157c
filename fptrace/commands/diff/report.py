"""The report's `diff --deep` section: the prompt on a second model, dtype or quantization."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fptrace.cli.options import STATS
from fptrace.cli.sections import Page, ReportSection
from fptrace.render.html import section

if TYPE_CHECKING:
    from fptrace.commands.diff.result import TraceDiff
    from fptrace.render.pagedata import SectionData

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


def _compute(page: Page, values: dict[str, Any]) -> TraceDiff | None:
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


def _data(against: TraceDiff) -> SectionData:
    """The relative difference at every point of every block (deep), and each row of the
    stream's, as heatmaps; a NaN/Inf point has no number (null) and its tooltip says n/a."""
    from fptrace.render.pagedata import Heatmap, SectionData

    maps = [Heatmap("‖a − b‖ / ‖a‖ of the stream after each layer (last position)",
                    "‖a − b‖ / ‖a‖",
                    tuple("embed" if r.layer is None else f"block {r.layer}"
                          for r in against.layers), ("stream",),
                    tuple((r.rel_diff,) for r in against.layers),
                    blocks=tuple(r.layer for r in against.layers))]
    deep = against.deep
    if deep is not None and deep.blocks:
        rows = []
        for blk in deep.blocks:
            rels = {p.point: p for p in blk.points}
            rows.append(tuple(None if p not in rels or rels[p].nonfinite else rels[p].rel
                              for p in deep.points))
        maps.append(Heatmap(f"‖a − b‖ / ‖a‖ at each point (tolerance {deep.tolerance:g}; "
                            "empty: NaN/Inf or not compared)", "‖a − b‖ / ‖a‖",
                            tuple(f"block {b}" for b in deep.layers), tuple(deep.points),
                            tuple(rows), blocks=tuple(deep.layers)))
    return SectionData("Two runs compared", heatmaps=tuple(maps))


SECTION = ReportSection(order=50, compute=_compute, body=_body, options=OPTIONS, data=_data)
