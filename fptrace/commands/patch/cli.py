"""`fptrace patch`."""

from __future__ import annotations

from typing import Annotated

import typer

from fptrace.cli.io import Group, load_for, output, prompt_command
from fptrace.cli.options import STATS, ChatOptions, LoadOptions, Outputs
from fptrace.cli.page import write_page


@prompt_command(order=60, group=Group.why, docs="patch",
                examples=('fptrace patch "The capital of France is" --noise " France"',))
def patch(
    prompt: Annotated[str | None, typer.Argument(
        help="The clean prompt (or --messages FILE).")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
    noise: Annotated[str | None, typer.Option(
        "--noise", help="Corrupt by adding Gaussian noise to the embeddings of this subject's "
        "tokens (e.g. ' France'): the tokens whose characters overlap it.",
        rich_help_panel=STATS)] = None,
    noise_occurrence: Annotated[int | None, typer.Option(
        "--noise-occurrence", min=1, help="Which occurrence of the subject, when the prompt "
        "holds it more than once (1 = the first).", rich_help_panel=STATS)] = None,
    corrupt: Annotated[str | None, typer.Option(
        "--corrupt", help="Corrupt with this prompt instead (same number of tokens).",
        rich_help_panel=STATS)] = None,
    what: Annotated[str, typer.Option("--what", help="Restore resid (the block's output), "
                                      "attn or mlp (what it added).",
                                      rich_help_panel=STATS)] = "resid",
    window: Annotated[int, typer.Option("--window", help="With attn/mlp: layers restored "
                                        "around each row's layer.", rich_help_panel=STATS)] = 1,
    target: Annotated[str | None, typer.Option(
        "--target", help="The token whose probability is measured (default: the clean top-1).",
        rich_help_panel=STATS)] = None,
    noise_scale: Annotated[float, typer.Option(
        "--noise-scale", help="Noise σ in units of the embedding's standard deviation.",
        rich_help_panel=STATS)] = 3.0,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Patched runs per "
                                            "forward pass.", rich_help_panel=STATS)] = 32,
    outputs: Outputs = Outputs(),
) -> None:
    """Where the prediction is carried: causal tracing.

    Where is the prediction carried? Causal tracing: corrupt the prompt, then restore one
    state (layer, position) at a time from the clean run and measure the target's probability."""

    from fptrace.cli.io import prompt_of

    corrupted = None if corrupt is None else prompt_of(corrupt, None if chat.whole() else chat)
    lm, prompt = load_for(prompt, opts, chat, outputs)
    from fptrace.commands.patch.core import patch as run_patch

    result = run_patch(lm, prompt, noise=noise, corrupt=corrupted, what=what, window=window,
                       target=target, noise_scale=noise_scale, seed=opts.seed,
                       batch_size=batch_size, noise_occurrence=noise_occurrence)
    from fptrace.commands.patch.render import patch_figure, patch_view

    output(result, patch_view, outputs, figure=patch_figure)
    write_page(outputs.html, lm, prompt, "patch", result)
