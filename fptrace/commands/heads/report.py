"""The report's grid of head roles (`fptrace report --heads`): blocks × heads, each cell the
head's roles, its colour the largest of its pattern scores, and its hover every score and what
each check by intervention measured."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from fptrace.cli.options import STATS
from fptrace.cli.sections import Page, ReportSection
from fptrace.render.html import section

if TYPE_CHECKING:
    from fptrace.commands.heads.result import Heads, HeadScores
    from fptrace.render.pagedata import SectionData

REPORT_INDUCTION = "2x16"  # the report's induction sequences: a page, not a survey

OPTIONS = (
    ("heads", Annotated[bool, typer.Option(
        "--heads", help="Add every attention head's role (as `fptrace heads` on the prompt, "
        "with the induction sequences of --heads-induction).", rich_help_panel=STATS)], False),
    ("heads_induction", Annotated[str, typer.Option(
        "--heads-induction", metavar="NxLEN", help="With --heads: N sequences of LEN seeded "
        "random tokens repeated once.", rich_help_panel=STATS)], REPORT_INDUCTION),
)


def _check(values: dict[str, Any]) -> None:
    from fptrace.commands.heads.inputs import parse_induction

    parse_induction(values["heads_induction"])


def _compute(page: Page, values: dict[str, Any]) -> Heads | None:
    from fptrace.commands.heads.core import heads
    from fptrace.commands.heads.inputs import parse_induction

    if not values["heads"]:
        return None
    n, length = parse_induction(values["heads_induction"])
    return heads(page.lm, [page.prompt], seed=page.opts.seed, induction=n,
                 induction_length=length)


def _body(result: Heads) -> list[str]:
    from fptrace.commands.heads.render import heads_view

    return section("What each attention head does: roles, measured and checked", "", None,
                   heads_view(result, 130))


def _data(result: Heads) -> SectionData:
    """The roles as a blocks × heads heatmap: a cell shows its roles (`P`, `I?`, `·`), its
    colour the largest pattern score, its hover every score and the checks' figures."""
    from fptrace.commands.heads.render import cell, score_lines
    from fptrace.render.pagedata import Heatmap, SectionData

    L = max((h.layer for h in result.heads), default=-1) + 1
    H = max((h.head for h in result.heads), default=-1) + 1
    grid = [[h for h in result.heads if h.layer == layer] for layer in range(L)]

    def top(h: HeadScores) -> float | None:
        got = [x for x in (h.previous, h.duplicate, h.induction, h.subject) if x is not None]
        return max(got) if got else None

    return SectionData("Head roles", heatmaps=(Heatmap(
        "every head's roles (P previous-token, I induction, D duplicate-token, S subject, "
        "s sink; X? pattern only)", "largest pattern score",
        tuple(f"block {layer}" for layer in range(L)), tuple(f"head {h}" for h in range(H)),
        tuple(tuple(top(h) for h in row) for row in grid), blocks=tuple(range(L)),
        labels=tuple(tuple(cell(h) for h in row) for row in grid),
        tips=tuple(tuple("\n".join(score_lines(h)) for h in row) for row in grid)),))


def _verify(result: Heads) -> None:
    from fptrace.cli.io import check_match

    check_match(result.ok, [c.name for c in result.checks if not c.ok])


SECTION = ReportSection(order=45, compute=_compute, body=_body, options=OPTIONS, check=_check,
                        verify=_verify, data=_data)
