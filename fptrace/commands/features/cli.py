"""`fptrace features`: the Typer command."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fptrace.cli.io import command, load_for, output, require_checks
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

DICTIONARY = "Dictionary"


@command(order=67, docs="features")
@chat_options()
@model_options()
def features(
    prompt: Annotated[Optional[str], typer.Argument(
        help="The prompt to read through the dictionaries (or --messages FILE).")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
    sae: Annotated[Optional[list[str]], typer.Option(
        "--sae", help="A folder holding an SAE of the stream: SAELens (cfg.json + "
        "sae_weights.safetensors), Gemma Scope (params.npz) or sparsify (cfg.json + "
        "sae.safetensors). Repeat it for several blocks.", rich_help_panel=DICTIONARY)] = None,
    transcoder: Annotated[Optional[list[str]], typer.Option(
        "--transcoder", help="A folder holding a transcoder (the MLP's input → its output), in "
        "the same formats.", rich_help_panel=DICTIONARY)] = None,
    site: Annotated[Optional[str], typer.Option(
        "--site", help="Where the dictionary reads (blocks.L.hook_resid_post, ...), for weights "
        "whose files do not say; where they do, it must agree.",
        rich_help_panel=DICTIONARY)] = None,
    latent: Annotated[Optional[int], typer.Option(
        "--latent", help="Follow latent N over the positions (and the dictionaries given).",
        rich_help_panel=STATS)] = None,
    top_prompts: Annotated[Optional[str], typer.Option(
        "--top-prompts", help="With --latent: the prompts of this .txt/.jsonl file (or folder) "
        "and positions where the latent is largest, streamed a group of prompts at a time.",
        rich_help_panel=STATS)] = None,
    top_n: Annotated[int, typer.Option("--top-n", help="Places --top-prompts lists.",
                                       rich_help_panel=STATS)] = 10,
    target: Annotated[Optional[str], typer.Option(
        "--target", help="The token whose logit is split through the dictionary (default: the "
        "model's top-1).", rich_help_panel=STATS)] = None,
    top: Annotated[int, typer.Option("--top", help="Latents listed per position and in the "
                                     "logit split.", rich_help_panel=STATS)] = 5,
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """What the stream is made of: each position read through sparse dictionaries (SAEs,
    transcoders), with the error term, and the target's logit split into one term per latent,
    b_dec, the error and the rest, summing to the model's logit."""
    from fptrace.commands.features.core import check_latent
    from fptrace.commands.features.dictionary import read_dictionary

    given = [(p, "sae") for p in sae or []] + [(p, "transcoder") for p in transcoder or []]
    dicts = [read_dictionary(p, site=site) for p, _ in given]  # a bad folder costs no load
    check_latent(dicts, latent)
    lm, prompt = load_for(prompt, opts, plot, chat)
    from fptrace.commands.features.core import features as run_features

    result = run_features(
        lm, prompt, saes=[d for d, (_, role) in zip(dicts, given) if role == "sae"],
        transcoders=[d for d, (_, role) in zip(dicts, given) if role == "transcoder"],
        top=top, latent=latent, target=target, top_prompts=top_prompts, top_n=top_n)
    from fptrace.commands.features.render import features_figure, features_view

    output(result, features_view, as_json=as_json, wide=wide, plot=plot, figure=features_figure)
    require_checks(result.checks, "the decomposition")
