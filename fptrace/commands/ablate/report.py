"""The report's ablation section (--ablate)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from fptrace.cli.options import STATS
from fptrace.cli.sections import Page, ReportSection
from fptrace.render.html import section

if TYPE_CHECKING:
    from fptrace.commands.ablate.result import Ablation
    from fptrace.render.pagedata import SectionData

OPTIONS = (
    ("ablate", Annotated[bool, typer.Option(
        "--ablate", help="Also an ablation section: every head and MLP removed one at a time "
        "(as `fptrace ablate --all-heads --all-mlps`).", rich_help_panel=STATS)], False),
)


def _compute(page: Page, values: dict[str, Any]) -> Ablation | None:
    from fptrace.commands.ablate.core import ablate

    if not values["ablate"]:
        return None
    return ablate(page.lm, page.prompt, all_heads=True, all_mlps=True)


def _body(ablation: Ablation) -> list[str]:
    from fptrace.commands.ablate.render import ablate_figure, ablate_view

    return section("What if: one head or MLP removed", "ablation grid",
                   ablate_figure(ablation)[0], ablate_view(ablation, 130))


def _verify(ablation: Ablation) -> None:
    from fptrace.cli.io import require_checks

    require_checks(ablation.checks, "the ablation")


def _data(ablation: Ablation) -> SectionData | None:
    """The target's logit change with each head or MLP removed, as a heatmap (blocks × heads,
    then the MLP)."""
    from fptrace.render.pagedata import Heatmap, SectionData
    from fptrace.render.text import visible

    heads = max((len(r) for r in ablation.head_grid), default=0)
    n = max(len(ablation.head_grid), len(ablation.mlp_column))
    if not n:
        return None
    rows = tuple((tuple(ablation.head_grid[i]) if i < len(ablation.head_grid) else (None,) * heads)
                 + ((ablation.mlp_column[i] if i < len(ablation.mlp_column) else None,)
                    if ablation.mlp_column else ()) for i in range(n))
    target = visible(ablation.target.text)
    return SectionData("Ablation", heatmaps=(Heatmap(
        f"change of “{target}”'s logit with one part removed ({ablation.mode})",
        f"Δ logit of “{target}”", tuple(f"block {i}" for i in range(n)),
        tuple(f"head {h}" for h in range(heads)) + (("MLP",) if ablation.mlp_column else ()),
        rows, blocks=tuple(range(n)), diverging=True),))


SECTION = ReportSection(order=70, compute=_compute, body=_body, options=OPTIONS,
                        verify=_verify, data=_data)
