"""The report's steering section (--add, --subtract, --steer-layer)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from fptrace.cli.options import STATS
from fptrace.cli.sections import Page, ReportSection
from fptrace.render.html import section

if TYPE_CHECKING:
    from fptrace.commands.steer.result import Steering
    from fptrace.render.pagedata import SectionData

OPTIONS = (
    ("add", Annotated[str | None, typer.Option(
        "--add", help="Also a steering section: this prompt's stream minus --subtract's, added "
        "at --steer-layer at strengths 0,1,2,4,8 (as `fptrace steer`).",
        rich_help_panel=STATS)], None),
    ("subtract", Annotated[str | None, typer.Option(
        "--subtract", help="With --add: the prompt subtracted.", rich_help_panel=STATS)], None),
    ("steer_layer", Annotated[str | None, typer.Option(
        "--steer-layer", metavar="L", help="With --add: the block whose output receives the "
        "vector.", rich_help_panel=STATS)], None),
)


def _block(values: dict[str, Any]) -> Any:
    """--steer-layer, read by the one parser of places, or None."""
    from fptrace.addresses import parse_block

    text = values["steer_layer"]
    return None if text is None else parse_block(text, "--steer-layer")


def _check(values: dict[str, Any]) -> None:
    add, subtract = values["add"], values["subtract"]
    if (add is None) != (subtract is None) or (add is not None and values["steer_layer"] is None):
        from fptrace.errors import BadInput, param

        raise BadInput(f"the steering section needs {param('add')}, {param('subtract')} and "
                       f"{param('steer_layer')}")
    _block(values)


def _compute(page: Page, values: dict[str, Any]) -> Steering | None:
    from fptrace.commands.steer.core import steer

    if values["add"] is None and values["subtract"] is None:
        return None
    return steer(page.lm, page.prompt, add=values["add"], subtract=values["subtract"],
                 layer=_block(values), scales="0,1,2,4,8")


def _body(steering: Steering) -> list[str]:
    from fptrace.commands.steer.render import steer_figure, steer_view

    return section("What if: a steering vector added to the stream", "steering sweep",
                   steer_figure(steering)[0], steer_view(steering, 130))


def _verify(steering: Steering) -> None:
    from fptrace.cli.io import require_checks

    require_checks(steering.checks, "the steered run")


def _data(steering: Steering) -> SectionData:
    """KL(steered ‖ clean) of the lens after each block, strength by strength, as a heatmap
    whose tooltips also name the lens's top-1 there."""
    from fptrace.render.pagedata import Heatmap, SectionData

    rows = steering.rows
    return SectionData("Steering", heatmaps=(Heatmap(
        "KL(steered ‖ clean) of the logit lens at the last position, after each block (nats)",
        "KL (nats)", tuple(f"strength {r.scale:g}" + (" (clean)" if r.clean else "")
                           for r in rows),
        tuple(f"block {b}" for b in steering.kl_layers), tuple(r.kl for r in rows)),))


SECTION = ReportSection(order=60, compute=_compute, body=_body, options=OPTIONS, check=_check,
                        verify=_verify, data=_data)
