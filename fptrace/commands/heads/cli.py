"""`fptrace heads`."""

from __future__ import annotations

from typing import Annotated

import typer

from fptrace.cli.io import Group, command, load, output
from fptrace.cli.options import STATS, LoadOptions, Outputs, model_options, output_options


@command(order=45, group=Group.why, docs="heads",
         examples=("fptrace heads prompts/seeds.txt --induction 2x16 --ov-tokens 0",
                   "fptrace heads prompts/seeds.txt --induction 2x16 --ov-tokens 0 --no-check "
                   "--head 17.3"))
@model_options()
@output_options(plot=False, html=False)
def heads(
    prompts: Annotated[list[str] | None, typer.Argument(
        help="Prompts: .txt or .jsonl files (a .jsonl line's \"subject\" names its subject), "
        "folders of them, or prompt texts; default the prompts shipped in prompts/.",
        show_default=False)] = None,
    opts: LoadOptions = LoadOptions(),
    head: Annotated[str | None, typer.Option(
        "--head", metavar="L.H", help="One head's scores with the positions that made them.",
        rich_help_panel=STATS)] = None,
    induction: Annotated[str, typer.Option(
        "--induction", metavar="NxLEN", help="N sequences of LEN seeded random tokens, each "
        "repeated once, for the induction score (0 for none).",
        rich_help_panel=STATS)] = "8x64",
    ov_tokens: Annotated[str, typer.Option(
        "--ov-tokens", metavar="N", help="Tokens sampled for the OV copying share (0: none; "
        "each costs d × vocabulary per head).", rich_help_panel=STATS)] = "32",
    check: Annotated[bool, typer.Option(
        "--check/--no-check", help="Check each role by intervention (removing the head, "
        "replacing a token) before giving it.", rich_help_panel=STATS)] = True,
    outputs: Outputs = Outputs(),
) -> None:
    """Attention heads' roles: measured, checked by removal.

    What each attention head does: previous-token, duplicate-token, induction, first-token
    (sink) and subject scores from the model's own attention weights, the OV circuit's copying
    scores from its weights, each role checked by an intervention before it is given, and the
    walkthrough's layer roles held against the grid (docs/heads.md)."""
    from fptrace.addresses import parse_head
    from fptrace.commands.heads.inputs import parse_induction, read_prompts
    from fptrace.numbers import parse_int

    focus = None if head is None else parse_head(head, "--head")
    n, length = parse_induction(induction)
    k = parse_int(ov_tokens, "--ov-tokens", low=0)
    texts, subjects = read_prompts(prompts or [])
    lm = load(opts)
    from fptrace.commands.heads.core import heads as run_heads
    from fptrace.commands.heads.render import heads_view

    result = run_heads(lm, texts, subjects=subjects, seed=opts.seed, induction=n,
                       induction_length=length, check=check, head=focus, ov_tokens=k)
    output(result, lambda r, w: heads_view(r, w, outputs.wide), outputs)
