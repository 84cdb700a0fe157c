"""The report's attribution of the top-1, and why one head attends where it does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from fptrace.cli.options import STATS
from fptrace.cli.sections import Page, ReportSection
from fptrace.render.html import section

if TYPE_CHECKING:
    from fptrace.commands.attribute.result import Attribution, QKAttribution
    from fptrace.render.pagedata import SectionData

OPTIONS = (
    ("qk", Annotated[str | None, typer.Option(
        "--qk", metavar="LAYER.HEAD", help="The head whose attention score the report splits "
        "(as `fptrace attribute --qk`); default: the head that adds most to the top-1.",
        rich_help_panel=STATS)], None),
)


def _head(values: dict[str, Any]) -> Any:
    """report --qk as a Head (parsed here, at the command line), or None."""
    from fptrace.addresses import parse_head

    return None if values["qk"] is None else parse_head(values["qk"], "--qk")


def _check(values: dict[str, Any]) -> None:
    _head(values)


def _compute(page: Page, values: dict[str, Any]
             ) -> tuple[Attribution, QKAttribution | None]:
    """(the attribution, the head's score split or None)."""
    from fptrace.commands.attribute.core import attribute
    from fptrace.commands.attribute.qk import attribute_qk, top_head

    lm = page.lm
    attribution = attribute(lm, page.prompt)
    head = _head(values) or top_head(attribution)
    split = None if head is None or lm.parts.family.qk_weights is None else \
        attribute_qk(lm, page.prompt, head, top=10)
    return attribution, split


def _body(result: tuple[Attribution, QKAttribution | None]) -> list[str]:
    from fptrace.commands.attribute.render import (
        attribution_figure,
        attribution_view,
        qk_figure,
        qk_view,
    )

    attribution, qk = result
    out = section("Where the answer comes from: direct logit attribution",
                  "attribution per block and per head", attribution_figure(attribution)[0],
                  attribution_view(attribution, 130))
    if qk is not None:
        out += section(f"Why head {qk.layer}.{qk.head} attends where it does: its score, part "
                       "by part", "query parts × key parts of the score", qk_figure(qk)[0],
                       qk_view(qk, 130))
    return out


def _data(result: tuple[Attribution, QKAttribution | None]) -> SectionData:
    """Each head's direct contribution as a heatmap (blocks × heads), each block's attention,
    MLP and heads when the block is opened, and the head's score split part by part."""
    from fptrace.commands.attribute.render import part_name
    from fptrace.render.pagedata import BlockDetail, Heatmap, SectionData
    from fptrace.render.text import visible

    a, qk = result
    target = visible(a.target.text)
    width = max((len(r) for r in a.head_grid), default=0)
    maps = []
    if width:
        maps.append(Heatmap(
            f"each head's direct logit contribution to “{target}”", "logits",
            tuple(f"block {i}" for i in range(len(a.head_grid))),
            tuple(f"head {h}" for h in range(width)),
            tuple(tuple(r) + (None,) * (width - len(r)) for r in a.head_grid),
            blocks=tuple(range(len(a.head_grid))), diverging=True))
    if qk is not None and qk.grid:
        maps.append(Heatmap(
            f"head {qk.layer}.{qk.head}'s score at query {qk.query}, key {qk.key}: query part × "
            "key part", "score", tuple(part_name(p, "q") for p in qk.grid_rows),
            tuple(part_name(p, "k") for p in qk.grid_columns), qk.grid, diverging=True))
    blocks = tuple(BlockDetail(la.layer, f"Attribution: direct logits to “{target}”", (
        ("attention (every head and the W_O bias)", la.attn), ("MLP", la.mlp),
        *((f"head {la.layer}.{h}", v) for h, v in enumerate(
            a.head_grid[la.layer] if la.layer < len(a.head_grid) else ())))) for la in a.layers)
    return SectionData("Direct logit attribution", heatmaps=tuple(maps), blocks=blocks)


def _verify(result: tuple[Attribution, QKAttribution | None]) -> None:
    from fptrace.cli.io import check_match

    _, split = result
    if split is not None:
        check_match(split.ok, [c.name for c in split.checks if not c.ok])


SECTION = ReportSection(order=30, compute=_compute, body=_body, options=OPTIONS, check=_check,
                        verify=_verify, data=_data)
