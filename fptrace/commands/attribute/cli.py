"""`fptrace attribute`: the Typer command."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fptrace.cli.io import command, load_for, output
from fptrace.cli.options import (
    STATS,
    ChatOptions,
    JsonOpt,
    LoadOptions,
    PlotOpt,
    WideOpt,
    chat_options,
    model_options,
)


@command(order=40, docs="attribute")
@chat_options()
@model_options()
def attribute(
    prompt: Annotated[Optional[str], typer.Argument(
        help="The text whose next-token logit is attributed (or --messages FILE).")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
    target: Annotated[Optional[str], typer.Option(
        "--target", help="The token whose logit is attributed (one token, e.g. ' Paris', or "
        "#ID); default: the model's top-1.", rich_help_panel=STATS)] = None,
    versus: Annotated[Optional[str], typer.Option(
        "--versus", help="Attribute the logit difference target − this token instead.",
        rich_help_panel=STATS)] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="How many of the largest "
                                     "contributions are listed.", rich_help_panel=STATS)] = 12,
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Which heads and MLPs made this answer: direct logit attribution that sums exactly to the
    model's own logit (exit 5 when it does not)."""

    lm, prompt = load_for(prompt, opts, plot, chat)
    from fptrace.commands.attribute.core import attribute as run_attribute

    result = run_attribute(lm, prompt, target=target, versus=versus, top=top)
    from fptrace.commands.attribute.render import attribution_figure, attribution_view

    output(result, attribution_view, as_json=as_json, wide=wide, plot=plot,
           figure=attribution_figure)
    if not result.ok:
        from fptrace.errors import Mismatch

        raise Mismatch(f"the parts do not sum to the model's logit (difference "
                       f"{result.difference:+.2e}; {result.tolerance})")


