"""`fptrace ablate`."""

from __future__ import annotations

from typing import Annotated

import typer

from fptrace.cli.io import Group, load_for, output, prompt_command, require_checks
from fptrace.cli.options import STATS, ChatOptions, LoadOptions, Outputs
from fptrace.cli.page import write_page
from fptrace.commands.ablate.modes import MODES
from fptrace.errors import as_flag

PARTS = "Parts"


@prompt_command(order=66, group=Group.why, docs="ablate",
                examples=(
                    'fptrace ablate "The capital of France is" --head 23.4 --mlp 27 --mlp 29',
                    'fptrace ablate "The capital of France is" --all-heads --top 5'),
                modes=MODES)
def ablate(
    prompt: Annotated[str | None, typer.Argument(
        help="The prompt whose next-token logit is followed (or --messages FILE).")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
    head: Annotated[list[str] | None, typer.Option(
        "--head", metavar="L.H", help="Remove attention head H of block L, as L.H (23.4, or L23H4; "
        "-1 counts from the end; repeat for several).", rich_help_panel=PARTS)] = None,
    mlp: Annotated[list[str] | None, typer.Option(
        "--mlp", metavar="L", help="Remove the MLP of block L (-1: the last; repeat for "
        "several).", rich_help_panel=PARTS)] = None,
    expert: Annotated[list[str] | None, typer.Option(
        "--expert", metavar="L.E", help="Remove routed expert E of block L's mixture of experts "
        "(3.5, or L3E5; repeat for several) from its router's choice: see --route.",
        rich_help_panel=PARTS)] = None,
    route: Annotated[str, typer.Option(
        "--route", help="With --expert, what a position that chose it does: renormalise (keep "
        "its other chosen experts, their weights renormalised where the family renormalises) "
        "or next (take its next choice).", rich_help_panel=PARTS)] = "renormalise",
    all_heads: Annotated[bool, typer.Option(
        "--all-heads", help="One head at a time, every head: a blocks × heads grid.",
        rich_help_panel=PARTS)] = False,
    all_mlps: Annotated[bool, typer.Option(
        "--all-mlps", help="One MLP at a time, every block.", rich_help_panel=PARTS)] = False,
    mode: Annotated[str, typer.Option(
        "--mode", help="zero (a removed part outputs zeros) or mean (its mean over positions).",
        rich_help_panel=PARTS)] = "zero",
    mean_over: Annotated[str | None, typer.Option(
        "--mean-over", help="With --mode mean: average over these prompts (a .txt of one a "
        'line, or .jsonl of {"prompt": ...}) instead of the prompt\'s positions.',
        rich_help_panel=PARTS)] = None,
    sae: Annotated[str | None, typer.Option(
        "--sae", help="With --latent N: remove what latent N of this SAE (SAELens, Gemma Scope "
        "or sparsify folder) wrote at the block it reads, at every position.",
        rich_help_panel=PARTS)] = None,
    latent: Annotated[int | None, typer.Option(
        "--latent", help="With --sae: the latent removed.", rich_help_panel=PARTS)] = None,
    target: Annotated[str | None, typer.Option(
        "--target", help="The token whose logit is followed (default: the clean top-1).",
        rich_help_panel=STATS)] = None,
    top: Annotated[int, typer.Option("--top", help="With a grid: how many of the largest "
                                     "effects are listed.", rich_help_panel=STATS)] = 10,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Ablated runs per "
                                            "forward pass.", rich_help_panel=STATS)] = 32,
    outputs: Outputs = Outputs(),
) -> None:
    """Remove heads, MLPs or experts: how the answer changes.

    What if a head, an MLP or an expert were gone? The target's logit with parts removed
    (zero or mean; an expert from its router's choice), the total effect next to the direct
    effect from attribution; --all-heads as a grid."""
    from fptrace.addresses import parse_block, parse_expert, parse_head
    from fptrace.cli.io import option_given
    from fptrace.cli.modes import chosen

    chosen(MODES, {  # parts or a latent (commands/ablate/modes.py)
        "--sae": sae is not None, "--latent": latent is not None, "--head": bool(head),
        "--mlp": bool(mlp), "--expert": bool(expert), "--all-heads": all_heads,
        "--all-mlps": all_mlps, "--mode": option_given("--mode", mode, "zero"),
        "--mean-over": mean_over is not None,
        "--route": option_given("--route", route, "renormalise")})
    heads = [parse_head(h, "--head") for h in head or ()]
    mlps = [parse_block(m, "--mlp") for m in mlp or ()]
    experts = [parse_expert(e, "--expert") for e in expert or ()]
    lm, prompt = load_for(prompt, opts, chat, outputs)
    from fptrace.commands.ablate.core import ablate as run_ablate

    result = run_ablate(lm, prompt, heads=heads, mlps=mlps, all_heads=all_heads,
                        all_mlps=all_mlps, mode=mode, mean_over=mean_over, target=target,
                        batch_size=batch_size, top=top, sae=sae, latent=latent,
                        experts=experts, route=route, named=as_flag)
    from fptrace.commands.ablate.render import ablate_figure, ablate_view

    output(result, ablate_view, outputs, figure=ablate_figure)
    write_page(outputs.html, lm, prompt, "ablate", result)
    require_checks(result.checks, "the ablation")
