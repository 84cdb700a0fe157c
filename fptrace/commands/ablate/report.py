"""The report's ablation section (--ablate)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fptrace.cli.options import STATS
from fptrace.cli.sections import Page, ReportSection
from fptrace.render.html import section

OPTIONS = (
    ("ablate", Annotated[bool, typer.Option(
        "--ablate", help="Also an ablation section: every head and MLP removed one at a time "
        "(as `fptrace ablate --all-heads --all-mlps`).", rich_help_panel=STATS)], False),
)


def _compute(page: Page, values: dict[str, Any]) -> Any:
    from fptrace.commands.ablate.core import ablate

    if not values["ablate"]:
        return None
    return ablate(page.lm, page.prompt, all_heads=True, all_mlps=True)


def _body(ablation: Any) -> list[str]:
    from fptrace.commands.ablate.render import ablate_figure, ablate_view

    return section("What if: one head or MLP removed", "ablation grid",
                   ablate_figure(ablation)[0], ablate_view(ablation, 130))


def _verify(ablation: Any) -> None:
    from fptrace.cli.io import require_checks

    require_checks(ablation.checks, "the ablation")


SECTION = ReportSection(order=70, compute=_compute, body=_body, options=OPTIONS,
                        verify=_verify)
