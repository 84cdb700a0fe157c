"""The report's causal-tracing section (--noise)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from fptrace.cli.options import STATS
from fptrace.cli.sections import Page, ReportSection
from fptrace.render.html import section

if TYPE_CHECKING:
    from fptrace.commands.patch.result import PatchResult
    from fptrace.render.pagedata import SectionData

OPTIONS = (
    ("noise", Annotated[str | None, typer.Option(
        "--noise", help="Also a causal-tracing section: noise on this subject's embeddings "
        "(as `fptrace patch --noise`).", rich_help_panel=STATS)], None),
)


def _compute(page: Page, values: dict[str, Any]) -> PatchResult | None:
    from fptrace.commands.patch.core import patch

    if values["noise"] is None:
        return None
    return patch(page.lm, page.prompt, noise=values["noise"], seed=page.opts.seed)


def _body(patching: PatchResult) -> list[str]:
    from fptrace.commands.patch.render import patch_figure, patch_view

    return section("Where the prediction is carried: causal tracing", "causal tracing heatmap",
                   patch_figure(patching)[0], patch_view(patching, 130))


def _data(patching: PatchResult) -> SectionData:
    """The restored probability of every (block, position) as a heatmap."""
    from fptrace.render.pagedata import Heatmap, SectionData
    from fptrace.render.text import visible

    target = visible(patching.target.text)
    return SectionData("Causal tracing", heatmaps=(Heatmap(
        f"p(“{target}”) with the clean state restored (clean {patching.p_clean:.4g}, corrupted "
        f"{patching.p_corrupt:.4g})", f"p(“{target}”)",
        tuple(f"block {i}" for i in range(len(patching.grid))),
        tuple(f"{i} {visible(t.text)}" for i, t in enumerate(patching.tokens)), patching.grid,
        blocks=tuple(range(len(patching.grid)))),))


SECTION = ReportSection(order=40, compute=_compute, body=_body, options=OPTIONS, data=_data)
