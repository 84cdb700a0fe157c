"""`fptrace attribute`: the Typer command."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from fptrace.cli.io import Group, load_for, output, prompt_command
from fptrace.cli.options import STATS, ChatOptions, LoadOptions, Outputs
from fptrace.cli.page import write_page
from fptrace.errors import as_flag

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel


@prompt_command(order=40, group=Group.why, docs="attribute",
                examples=('fptrace attribute "The capital of France is" --top 8',
                          'fptrace attribute "The capital of France is" --qk 23.4 --group source '
                          '--top 5'))
def attribute(
    prompt: Annotated[str | None, typer.Argument(
        help="The text whose next-token logit is attributed (or --messages FILE).")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
    target: Annotated[str | None, typer.Option(
        "--target", help="The token whose logit is attributed (one token, e.g. ' Paris', or "
        "#ID); default: the model's top-1.", rich_help_panel=STATS)] = None,
    versus: Annotated[str | None, typer.Option(
        "--versus", help="Attribute the logit difference target − this token instead.",
        rich_help_panel=STATS)] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="How many of the largest "
                                     "contributions are listed.", rich_help_panel=STATS)] = 12,
    qk: Annotated[str | None, typer.Option(
        "--qk", metavar="LAYER.HEAD", help="Instead: why head HEAD of block LAYER attends where "
        "it does (23.4 or L23H4): its score split into query-part × key-part terms that sum to "
        "the model's score.", rich_help_panel=STATS)] = None,
    query: Annotated[str | None, typer.Option(
        "--query", metavar="POSITION", help="With --qk: the query position (default: the last; "
        "-1 counts from the end).", rich_help_panel=STATS)] = None,
    key: Annotated[str | None, typer.Option(
        "--key", metavar="POSITION", help="With --qk: the key position (default: the one the "
        "query attends to most).", rich_help_panel=STATS)] = None,
    group: Annotated[str, typer.Option(
        "--group", help="With --qk: list terms (query part × key part), or sources (each "
        "side's parts summed over the other side).", rich_help_panel=STATS)] = "term",
    outputs: Outputs = Outputs(),
) -> None:
    """Which heads and MLPs wrote the answer's logit, exactly.

    Which heads and MLPs made this answer: direct logit attribution that sums exactly to the
    model's own logit (exit 5 when it does not). With --qk: why one head attends where it does."""

    from fptrace.addresses import parse_head, parse_position
    from fptrace.commands.attribute.qk import qk_request

    head = None if qk is None else parse_head(qk, "--qk")
    qk_request(head, query, key, group, target, versus)
    i = None if query is None else parse_position(query, "--query")
    j = None if key is None else parse_position(key, "--key")
    lm, prompt = load_for(prompt, opts, chat, outputs)
    if head is not None:
        return attribute_qk_cli(lm, prompt, head, i, j, group, top, outputs)
    from fptrace.commands.attribute.core import attribute as run_attribute

    result = run_attribute(lm, prompt, target=target, versus=versus, top=top, named=as_flag)
    from fptrace.commands.attribute.render import attribution_figure, attribution_view

    output(result, attribution_view, outputs, figure=attribution_figure)
    write_page(outputs.html, lm, prompt, "attribute", (result, None))
    if not result.ok:
        from fptrace.errors import Mismatch

        raise Mismatch(f"the parts do not sum to the model's logit (difference "
                       f"{result.difference:+.2e}; {result.tolerance})")


def attribute_qk_cli(lm: LoadedModel, prompt: str, head: Any, query: Any, key: Any, group: str,
                     top: int, outputs: Outputs) -> None:
    """`attribute --qk`: the split of one attention score, printed; exit 5 when it does not
    match the model."""
    from fptrace.commands.attribute.qk import attribute_qk
    from fptrace.commands.attribute.render import qk_figure, qk_view

    result = attribute_qk(lm, prompt, head, query=query, key=key, top=top, group=group)
    output(result, qk_view, outputs, figure=qk_figure)
    if outputs.html is not None:  # the page's attribution section: the top-1's, with this split
        from fptrace.commands.attribute.core import attribute as run_attribute

        write_page(outputs.html, lm, prompt, "attribute", (run_attribute(lm, prompt), result))
    if not result.ok:
        from fptrace.errors import Mismatch

        failed = "; ".join(f"{c.name}: {c.value:.2e}, {c.tolerance}" for c in result.checks
                           if not c.ok)
        raise Mismatch(f"the split does not match the model ({failed})")
