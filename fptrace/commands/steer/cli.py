"""`fptrace steer`."""

from __future__ import annotations

from typing import Annotated

import typer

from fptrace.cli.io import Group, load_for, output, prompt_command, require_checks, stderr_console
from fptrace.cli.options import OUTPUT, STATS, ChatOptions, LoadOptions, Outputs
from fptrace.cli.page import write_page
from fptrace.commands.steer.modes import MODES
from fptrace.errors import BadInput

VECTOR = "Steering vector"


@prompt_command(order=65, group=Group.why, docs="steer",
                examples=('fptrace steer "I think that you are" --add " love" --subtract " hate" '
                          "--layer 6 --scale 0,0.25,0.5,1 -n 8",), modes=MODES)
def steer(
    prompt: Annotated[str | None, typer.Argument(
        help="The prompt to steer (or --messages FILE).")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
    add: Annotated[str | None, typer.Option(
        "--add", help="The vector is this text's stream after --layer minus --subtract's (plain "
        "text: --chat does not template it).",
        rich_help_panel=VECTOR)] = None,
    subtract: Annotated[str | None, typer.Option(
        "--subtract", help="The prompt subtracted (with --add).", rich_help_panel=VECTOR)] = None,
    pairs: Annotated[str | None, typer.Option(
        "--pairs", help='JSON Lines of {"positive": ..., "negative": ...}: the vector is their '
        "mean difference (--method mean) or its first principal direction (pca).",
        rich_help_panel=VECTOR)] = None,
    method: Annotated[str, typer.Option("--method", help="With --pairs: mean or pca.",
                                        rich_help_panel=VECTOR)] = "mean",
    vector: Annotated[str | None, typer.Option(
        "--vector", help="A llama.cpp control vector (.gguf, direction.N added to block N's "
        "output), a .safetensors or a .npy of (d_model,) or (n_layers, d_model).",
        rich_help_panel=VECTOR)] = None,
    token: Annotated[str | None, typer.Option(
        "--token", help="The LM head's row of this token (e.g. ' Paris').",
        rich_help_panel=VECTOR)] = None,
    sae: Annotated[str | None, typer.Option(
        "--sae", help="With --latent N: the direction is latent N's decoder row in this SAE "
        "(SAELens, Gemma Scope or sparsify folder), added at the block whose output it reads; "
        "--scale S adds S·dᵢ.", rich_help_panel=VECTOR)] = None,
    latent: Annotated[int | None, typer.Option(
        "--latent", help="With --sae: the latent.", rich_help_panel=VECTOR)] = None,
    layer: Annotated[str | None, typer.Option(
        "--layer", "-l", metavar="L", help="The block whose output receives the vector (and "
        "where --add, --subtract and --pairs are measured); -1: the last.",
        rich_help_panel=VECTOR)] = None,
    mean_positions: Annotated[bool, typer.Option(
        "--mean-positions", help="Measure --add/--subtract/--pairs as the mean over each "
        "prompt's positions instead of its last position.", rich_help_panel=VECTOR)] = False,
    norm_match: Annotated[bool, typer.Option(
        "--norm-match", help="Scale the vector to the clean stream's norm at that block (last "
        "position).", rich_help_panel=VECTOR)] = False,
    save_vector: Annotated[str | None, typer.Option(
        "--save-vector", help="Write the vector: .gguf in llama.cpp's control-vector layout "
        "(--control-vector-scaled F.gguf:S), .safetensors or .npy.",
        rich_help_panel=OUTPUT)] = None,
    scale: Annotated[str, typer.Option(
        "--scale", help="Strength, or strengths separated by commas (0,1,2,4,8): one batched "
        "forward pass, a row per strength.", rich_help_panel=STATS)] = "1",
    positions: Annotated[str, typer.Option(
        "--positions", help="Where the vector is added: all (every position, generated tokens "
        "included), last, or prompt positions such as 0,3,-1 or 0-3.",
        rich_help_panel=STATS)] = "all",
    target: Annotated[str | None, typer.Option(
        "--target", help="The token whose logit and probability are followed (default: the "
        "clean top-1).", rich_help_panel=STATS)] = None,
    new_tokens: Annotated[int, typer.Option(
        "-n", "--new-tokens", help="Also a greedy continuation of N tokens per strength, "
        "steered the same way.", rich_help_panel=STATS)] = 0,
    top: Annotated[int, typer.Option("--top", help="Next tokens listed per strength.",
                                     rich_help_panel=STATS)] = 5,
    outputs: Outputs = Outputs(),
) -> None:
    """Add a direction to the stream at a sweep of strengths.

    What if the stream had a direction added? Activation steering at a sweep of strengths in
    one batched forward pass, measured against the clean run block by block."""
    from fptrace.addresses import parse_block, parse_selection
    from fptrace.cli.io import option_given
    from fptrace.cli.modes import chosen
    from fptrace.commands.steer.core import parse_scales
    from fptrace.commands.steer.modes import MISSING

    chosen(MODES, {  # the vector's one source (commands/steer/modes.py)
        "--sae": sae is not None, "--latent": latent is not None, "--vector": vector is not None,
        "--pairs": pairs is not None, "--add": add is not None, "--subtract": subtract is not None,
        "--token": token is not None, "--layer": layer is not None,
        "--method": option_given("--method", method, "mean"),
        "--mean-positions": mean_positions}, MISSING)
    parse_scales(scale)
    block = None if layer is None else parse_block(layer, "--layer")
    where = parse_selection(positions, "--positions")
    if save_vector is not None:
        from fptrace.commands.steer.vectors import check_vector_path

        check_vector_path(save_vector, force=outputs.force)
    lm, prompt = load_for(prompt, opts, chat, outputs)
    from fptrace.commands.steer.core import steer as run_steer
    from fptrace.commands.steer.vectors import match_norms, steering_vector, write_vector

    if sae is not None or latent is not None:  # steer --sae DIR --latent N
        from fptrace.commands.steer.vectors import latent_vector

        if sae is None:
            raise BadInput("--latent goes with --sae DIR: the SAE whose latent is added")
        vec = latent_vector(lm, sae, latent)
    else:
        vec = steering_vector(lm, add=add, subtract=subtract, pairs=pairs, method=method,
                              vector=vector, token=token, layer=block,
                              mean_positions=mean_positions, prompt=prompt)
    if norm_match:
        vec = match_norms(lm, prompt, vec)
    if save_vector is not None:
        write_vector(save_vector, vec, lm, outputs.force)
        stderr_console().print(f"wrote {save_vector}", markup=False, style="dim",
                               soft_wrap=True)
    result = run_steer(lm, prompt, vector=vec, scales=scale, positions=where, target=target,
                       top=top, new_tokens=new_tokens)
    from fptrace.commands.steer.render import steer_figure, steer_view

    output(result, steer_view, outputs, figure=steer_figure)
    write_page(outputs.html, lm, prompt, "steer", result)
    require_checks(result.checks, "the steered run")
