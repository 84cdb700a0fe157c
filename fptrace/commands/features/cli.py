"""`fptrace features`: the Typer command."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

import typer

from fptrace.cli.io import (
    Group,
    load,
    load_for,
    output,
    prompt_command,
    require_checks,
    stderr_console,
)
from fptrace.cli.options import STATS, ChatOptions, LoadOptions, Outputs
from fptrace.cli.page import write_page
from fptrace.commands.features.modes import MODES
from fptrace.errors import BadInput

DICTIONARY = "Dictionary"
TRAIN = "Training (features train PROMPTS...)"


def bare_transcoder(words: list[str]) -> list[str]:
    """`--transcoder` takes a folder, except in `features train`, where it is a flag: a bare
    `--transcoder` (last, or before another option) is read as the flag, --train-transcoder."""
    return ["--train-transcoder" if w == "--transcoder" and
            (j + 1 == len(words) or (words[j + 1].startswith("-") and words[j + 1] != "-"))
            else w for j, w in enumerate(words)]


@prompt_command(order=67, group=Group.why, docs="features",
                examples=("fptrace features train prompts/ --layer 15 --out sae15 --latents 512 "
                          "--k 16 --tokens 16384",
                          'fptrace features "The capital of France is" --sae sae15 --top 3'),
                words=bare_transcoder, modes=MODES)
def features(
    args: Annotated[list[str] | None, typer.Argument(
        metavar="PROMPT | train PROMPTS...",
        help="The prompt to read through the dictionaries (or --messages FILE); or `train` and "
        ".txt/.jsonl prompt files (or folders) to train a TopK SAE on (with --transcoder: a "
        "transcoder per block).")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
    sae: Annotated[list[str] | None, typer.Option(
        "--sae", help="A folder holding an SAE of the stream: SAELens (cfg.json + "
        "sae_weights.safetensors), Gemma Scope (params.npz) or sparsify (cfg.json + "
        "sae.safetensors). Repeat it for several blocks.", rich_help_panel=DICTIONARY)] = None,
    transcoder: Annotated[list[str] | None, typer.Option(
        "--transcoder", help="A folder holding a transcoder (the MLP's input → its output), in "
        "the same formats. With `train`, a flag: train transcoders (one per block of --layers) "
        "instead of an SAE.", rich_help_panel=DICTIONARY)] = None,
    train_transcoder: Annotated[bool, typer.Option(
        "--train-transcoder", hidden=True, help="`features train --transcoder` (a bare "
        "--transcoder is read as this flag).")] = False,
    site: Annotated[str | None, typer.Option(
        "--site", help="Where the dictionary reads (blocks.L.hook_resid_post, ...), for weights "
        "whose files do not say; where they do, it must agree.",
        rich_help_panel=DICTIONARY)] = None,
    latent: Annotated[int | None, typer.Option(
        "--latent", help="Follow latent N over the positions (and the dictionaries given).",
        rich_help_panel=STATS)] = None,
    top_prompts: Annotated[str | None, typer.Option(
        "--top-prompts", help="With --latent: the prompts of this .txt/.jsonl file (or folder) "
        "and positions where the latent is largest, streamed a group of prompts at a time.",
        rich_help_panel=STATS)] = None,
    top_n: Annotated[int, typer.Option("--top-n", help="Places --top-prompts lists.",
                                       rich_help_panel=STATS)] = 10,
    target: Annotated[str | None, typer.Option(
        "--target", help="The token whose logit is split through the dictionary (default: the "
        "model's top-1).", rich_help_panel=STATS)] = None,
    top: Annotated[int, typer.Option("--top", help="Latents listed per position and in the "
                                     "logit split.", rich_help_panel=STATS)] = 5,
    layer: Annotated[str | None, typer.Option(
        "--layer", "-l", metavar="L", help="train: the block after which the stream is read "
        "(-1: the last).",
        rich_help_panel=TRAIN)] = None,
    layers: Annotated[str | None, typer.Option(
        "--layers", metavar="SEL", help="train --transcoder: the blocks to train a transcoder "
        "for: all (the default), 0-29, 3,5,7.", rich_help_panel=TRAIN)] = None,
    out: Annotated[str | None, typer.Option(
        "--out", help="train: the new folder for the SAE (SAELens's layout), or for the "
        "transcoders (a layer_L folder each).", rich_help_panel=TRAIN)] = None,
    export: Annotated[str | None, typer.Option(
        "--export", metavar="FORMAT", help="train --transcoder: also write the transcoders in "
        "circuit-tracer's layout (`circuit-tracer`: JumpReLU, the nearest to TopK it loads), in "
        "OUT/circuit-tracer.", rich_help_panel=TRAIN)] = None,
    skip: Annotated[bool, typer.Option(
        "--skip", help="train --transcoder: skip transcoders: an affine term x·W_skip beside "
        "the latents (started as the least-squares map), for MLPs that are mostly linear.",
        rich_help_panel=TRAIN)] = False,
    latents: Annotated[int, typer.Option("--latents", help="train: latents (d_sae).",
                                         rich_help_panel=TRAIN)] = 2048,
    k: Annotated[int, typer.Option("--k", help="train: latents kept per token.",
                                   rich_help_panel=TRAIN)] = 32,
    tokens: Annotated[int, typer.Option("--tokens", help="train: training tokens the optimiser "
                                        "sees (the positions are reused epoch after epoch).",
                                        rich_help_panel=TRAIN)] = 200_000,
    batch_tokens: Annotated[int, typer.Option("--batch-tokens", help="train: tokens per step.",
                                              rich_help_panel=TRAIN)] = 1024,
    lr: Annotated[float | None, typer.Option(
        "--lr", help="train: Adam's learning rate (default 5e-4 for an SAE, 2e-3 for "
        "transcoders, whose rows are scaled to a mean norm of √d).",
        rich_help_panel=TRAIN)] = None,
    train_seed: Annotated[int, typer.Option("--train-seed", help="train: the seed of the SAE's initial weights, "
                                      "the held-out split and the data order.",
                                      rich_help_panel=TRAIN)] = 0,
    resume: Annotated[bool, typer.Option("--resume", help="train: continue the interrupted "
                                         "training written in --out.",
                                         rich_help_panel=TRAIN)] = False,
    outputs: Outputs = Outputs(),
) -> None:
    """Read the stream through sparse dictionaries; train them.

    What the stream is made of: each position read through sparse dictionaries (SAEs,
    transcoders), with the error term, and the target's logit split into one term per latent,
    b_dec, the error and the rest, summing to the model's logit."""
    from fptrace.cli.io import option_given
    from fptrace.cli.modes import chosen

    words = list(args or [])
    train = words[:1] == ["train"]
    mode = chosen(MODES, {  # read, or train an SAE or transcoders (commands/features/modes.py)
        "train --transcoder": train and train_transcoder, "train": train and not train_transcoder,
        "--html": outputs.html is not None, "--layers": layers is not None,
        "--export": export is not None, "--skip": skip,
        "--transcoder DIR": transcoder[0] if transcoder else False,
        "--transcoder": train_transcoder and not train, "--layer": layer is not None,
        "--out": out is not None, "--latents": option_given("--latents", latents, 2048),
        "--k": option_given("--k", k, 32),
        "--tokens": option_given("--tokens", tokens, 200_000),
        "--batch-tokens": option_given("--batch-tokens", batch_tokens, 1024),
        "--lr": lr is not None, "--train-seed": option_given("--train-seed", train_seed, 0),
        "--resume": resume,
        "--sae": bool(sae), "--site": site is not None, "--latent": latent is not None,
        "--top-prompts": top_prompts is not None,
        "--top-n": option_given("--top-n", top_n, 10),
        "--target": target is not None, "--top": option_given("--top", top, 5)})
    if mode is not MODES[-1]:
        options = (latents, k, tokens, batch_tokens, lr, train_seed)
        if mode is MODES[0]:
            return transcoders_cli(words[1:], opts, layers, out, export, skip, options, resume,
                                   outputs)
        return train_cli(words[1:], opts, layer, out, *options, resume, outputs)
    if len(words) > 1:
        raise BadInput(f"give one PROMPT (quoted), or `train` and prompt files; got {len(words)} "
                       "arguments")
    prompt = words[0] if words else None
    from fptrace.commands.features.core import check_latent
    from fptrace.core.dictionaries import read_dictionary

    given = [(p, "sae") for p in sae or []] + [(p, "transcoder") for p in transcoder or []]
    # read before the model loads: a bad folder costs no load
    dicts = [read_dictionary(p, site=site, what=f"--{flag}") for p, flag in given]
    check_latent(dicts, latent)
    lm, prompt = load_for(prompt, opts, chat, outputs)
    from fptrace.commands.features.core import features as run_features

    result = run_features(
        lm, prompt, saes=[d for d, (_, role) in zip(dicts, given) if role == "sae"],
        transcoders=[d for d, (_, role) in zip(dicts, given) if role == "transcoder"],
        top=top, latent=latent, target=target, top_prompts=top_prompts, top_n=top_n)
    from fptrace.commands.features.render import features_figure, features_view

    output(result, features_view, outputs, figure=features_figure)
    write_page(outputs.html, lm, prompt, "features", result)
    require_checks(result.checks, "the decomposition")


def train_cli(inputs: list[str], opts: LoadOptions, layer: str | None, out: str | None,
              latents: int, k: int, tokens: int, batch_tokens: int, lr: float | None, seed: int,
              resume: bool, outputs: Outputs) -> None:
    """`fptrace features train PROMPTS --layer L --out DIR`: checked before the load, a progress
    bar on stderr, the result on stdout."""
    from fptrace.numbers import check_finite

    if not inputs:
        raise BadInput("features train: give prompt files (.txt, .jsonl) or folders to train on")
    if layer is None or out is None:
        raise BadInput("features train needs --layer L and --out DIR")
    from fptrace.addresses import parse_block, resolve_block
    from fptrace.commands.features.train import TrainOptions, check_before_load, check_out, train

    lr = TrainOptions.lr if lr is None else lr  # the dataclass's default
    check_finite(lr, "--lr", low=0.0)
    from fptrace.core.trace import sizes

    block = parse_block(layer, "--layer")
    check_out(out, resume)
    options = TrainOptions(layer=0, latents=latents, k=k, tokens=tokens,
                           batch_tokens=batch_tokens, lr=lr, seed=seed)
    items = check_before_load(options, inputs, opts.model)
    lm = load(opts)
    options = replace(options, layer=resolve_block(block, sizes(lm), "--layer").layer)
    from fptrace.render.progress import training_progress

    with training_progress(stderr_console(), "collecting the stream: prompts") as progress:
        result = train(lm, inputs, out, options, resume=resume, progress=progress, items=items)
    from fptrace.commands.features.render import train_view

    output(result, train_view, outputs)


def transcoders_cli(inputs: list[str], opts: LoadOptions, layers: str | None, out: str | None,
                    export: str | None, skip: bool, numbers: tuple,
                    resume: bool, outputs: Outputs) -> None:
    """`fptrace features train PROMPTS --transcoder [--layers SEL] --out DIR [--skip] [--export
    circuit-tracer]`: checked before the load, progress bars on stderr, the result on
    stdout."""
    from fptrace.numbers import check_finite

    if not inputs:
        raise BadInput("features train: give prompt files (.txt, .jsonl) or folders to train on")
    if out is None:
        raise BadInput("features train --transcoder needs --out DIR")
    from fptrace.addresses import parse_selection
    from fptrace.commands.features.train import TrainOptions
    from fptrace.commands.features.transcoders import (
        TRANSCODER_LR,
        check_before_load,
        train_transcoders,
    )

    latents, k, tokens, batch_tokens, lr, seed = numbers
    lr = TRANSCODER_LR if lr is None else lr
    check_finite(lr, "--lr", low=0.0)

    chosen = None if layers is None else parse_selection(layers, "--layers")
    options = TrainOptions(layer=0, latents=latents, k=k, tokens=tokens,
                           batch_tokens=batch_tokens, lr=lr, seed=seed, skip=skip)
    items = check_before_load(options, inputs, opts.model, chosen, export, out, resume)
    lm = load(opts)
    from fptrace.render.progress import training_progress

    with training_progress(stderr_console(),
                           "collecting the MLPs' inputs and outputs: prompts") as progress:
        result = train_transcoders(lm, inputs, out, options, chosen, export=export,
                                   resume=resume, progress=progress, items=items)
    from fptrace.commands.features.render import transcoders_view

    output(result, transcoders_view, outputs)
