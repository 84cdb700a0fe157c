"""The report's features section (--sae): the stream read through a sparse dictionary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from fptrace.cli.options import STATS
from fptrace.cli.sections import Page, ReportSection
from fptrace.render.html import section

if TYPE_CHECKING:
    from fptrace.commands.features.result import Features
    from fptrace.render.pagedata import SectionData

OPTIONS = (
    ("sae", Annotated[str | None, typer.Option(
        "--sae", help="Also a features section: the prompt read through the SAE in this folder "
        "(SAELens, Gemma Scope or sparsify), as `fptrace features`.",
        rich_help_panel=STATS)], None),
)


def _check(values: dict[str, Any]) -> None:
    if values["sae"] is not None:
        from fptrace.core.dictionaries import read_dictionary

        read_dictionary(values["sae"])  # a bad folder costs no load


def _compute(page: Page, values: dict[str, Any]) -> Features | None:
    from fptrace.commands.features.core import features

    if values["sae"] is None:
        return None
    return features(page.lm, page.prompt, saes=[values["sae"]])


def _body(result: Features) -> list[str]:
    from fptrace.commands.features.render import features_figure, features_view

    return section("What the stream is made of: sparse dictionary features", "features",
                   features_figure(result)[0], features_view(result, 130))


def _verify(result: Features) -> None:
    from fptrace.cli.io import require_checks

    require_checks(result.checks, "the decomposition")


def _data(result: Features) -> SectionData:
    """Each dictionary's readout, position by position: ‖x‖, ‖error‖, its share and L0."""
    from fptrace.render.pagedata import Heatmap, SectionData
    from fptrace.render.text import visible

    labels = tuple(f"{i} {visible(t.text)}" for i, t in enumerate(result.tokens))
    return SectionData("Features", heatmaps=tuple(Heatmap(
        f"{d.site}, read by {d.path}: ‖error‖² / ‖x‖² at each position", "‖error‖² / ‖x‖²",
        ("‖error‖² / ‖x‖²",), tuple(labels[p.position] for p in d.positions),
        (tuple(p.relative_error for p in d.positions),)) for d in result.dictionaries))


SECTION = ReportSection(order=65, compute=_compute, body=_body, options=OPTIONS, check=_check,
                        verify=_verify, data=_data)
