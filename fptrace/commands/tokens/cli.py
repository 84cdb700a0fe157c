"""`fptrace tokens`."""

from __future__ import annotations

from typing import Annotated

import typer

from fptrace.cli.io import Group, command, output
from fptrace.cli.options import IdsFileOpt, IdsOpt, Outputs, output_options
from fptrace.models.registry import DEFAULT_MODEL, RESOLUTION_HELP


@command(order=25, group=Group.trace, docs="tokens",
         examples=('fptrace tokens "The cat sat on the mat" -m gpt2',
                   "fptrace tokens --ids 464,3797,3332,0,319,866,50256 -m gpt2"))
@output_options(plot=False, html=False)
def tokens(
    text: Annotated[str | None, typer.Argument(help="The text to tokenize (or --ids).")] = None,
    model: Annotated[str, typer.Option("--model", "-m", help=RESOLUTION_HELP,
                                       rich_help_panel="Model")] = DEFAULT_MODEL,
    ids: IdsOpt = None,
    ids_file: IdsFileOpt = None,
    outputs: Outputs = Outputs(),
) -> None:
    """A text's token ids, pieces and byte offsets, or what ids are.

    The ids, pieces and byte offsets a model's tokenizer makes of TEXT, or the pieces, texts
    and special marks of given ids (--ids): only the tokenizer is loaded, never the weights."""
    from fptrace.cli.io import prompt_of
    from fptrace.cli.options import ChatOptions
    from fptrace.commands.tokens.core import tokens as tokenize
    from fptrace.commands.tokens.render import tokens_view

    given = prompt_of(text, ChatOptions(ids=ids, ids_file=ids_file))
    output(tokenize(model, given), tokens_view, outputs)
