"""The report's walkthrough of one block, and the options that choose it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from fptrace.cli.options import STATS
from fptrace.cli.sections import Page, ReportSection
from fptrace.render.html import png, terminal

if TYPE_CHECKING:
    from fptrace.commands.explain.result import Explanation
    from fptrace.render.pagedata import SectionData

OPTIONS = (
    ("layer", Annotated[str, typer.Option("--layer", "-l", metavar="L", help="The block the "
                                          "walkthrough recomputes.", rich_help_panel=STATS)],
     "0"),
    ("head", Annotated[str, typer.Option("--head", metavar="H", help="The head whose matrix "
                                         "the walkthrough shows.", rich_help_panel=STATS)], "0"),
)


def _places(values: dict[str, Any]) -> tuple[Any, Any]:
    """--layer and --head, read by the one parser of places (before the model loads)."""
    from fptrace.addresses import parse_block, parse_index

    return parse_block(values["layer"], "--layer"), parse_index(values["head"], "--head", "head")


def _check(values: dict[str, Any]) -> None:
    _places(values)


def _compute(page: Page, values: dict[str, Any]) -> Explanation:
    from fptrace.commands.explain.core import covered, explain

    covered(page.lm.parts.family)
    block, head = _places(values)
    return explain(page.lm, page.prompt, layer=block, head=head, all_heads=True)


def _figures(e: Explanation) -> list[str]:
    from fptrace.commands.explain.render import attention_figure

    return [f'<img alt="attention of every head at block {e.layer}" '
            f'src="{png(attention_figure(e)[0])}">']


def _body(e: Explanation) -> list[str]:
    from fptrace.commands.explain.render import explain_view

    verdict = ('<p class="verdict-ok">The recomputed block matches the model.</p>'
               if e.match else
               '<p class="verdict-bad">THE RECOMPUTATION DOES NOT MATCH THE MODEL.</p>')
    return [f"<h2>Block {e.layer}, step by step</h2>", verdict, terminal(explain_view(e))]


def _data(e: Explanation) -> SectionData:
    """Its steps and checks, shown when block e.layer is opened; the shown head's attention
    weights as a heatmap."""
    from fptrace.render.pagedata import BlockDetail, Heatmap, SectionData
    from fptrace.render.text import visible

    steps = tuple((f"{s.index}. {s.name}", f"{s.formula}   shape {tuple(s.shape)}")
                  for s in e.steps)
    checks = tuple((f"check: {c.name} ({c.tolerance}{'' if c.ok else ', FAILED'})", c.value)
                   for c in e.checks)
    labels = tuple(f"{i} {visible(t.text)}" for i, t in enumerate(e.tokens))
    maps = tuple(Heatmap(f"head {e.layer}.{m.head}, attention weights (rows: queries, columns: "
                         "keys)", "weight", labels[:len(m.rows)], labels[:len(m.rows)], m.rows)
                 for m in e.matrices if m.name == "weights")
    return SectionData(f"Block {e.layer}, step by step", heatmaps=maps, blocks=(
        BlockDetail(e.layer, f"Explain: block {e.layer} recomputed step by step", steps),
        BlockDetail(e.layer, "Explain: its checks against the model", checks)))


def _verify(e: Explanation) -> None:
    from fptrace.cli.io import check_match

    check_match(e.match, [c.name for c in e.checks if not c.ok])


SECTION = ReportSection(order=20, compute=_compute, figures=_figures, body=_body,
                        options=OPTIONS, check=_check, verify=_verify, data=_data)
