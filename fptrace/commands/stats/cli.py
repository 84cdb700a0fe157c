"""`fptrace stats`."""

from __future__ import annotations

from typing import Annotated

import typer

from fptrace.cli.io import Group, command, fail, load, show, stderr_console, write_plot
from fptrace.cli.options import (
    OUTPUT,
    STATS,
    GpusPerWorkerOpt,
    JsonOpt,
    LoadOptions,
    PlotOpt,
    RayOpt,
    WideOpt,
    WorkersOpt,
    model_options,
)
from fptrace.errors import BadInput


@command(order=85, group=Group.compare, docs="stats",
         examples=('fptrace stats prompts/capitals.txt --out stats.json',
                   'fptrace stats --merge stats.json --top 2'))
@model_options()
def stats(
    inputs: Annotated[list[str], typer.Argument(
        help="Prompts, as for batch: .txt files (one prompt per line), .jsonl files ({\"id\": "
        "..., \"prompt\": ...} per line), folders of them, or - for stdin. With --merge: "
        "statistics files.", show_default=False)],
    opts: LoadOptions,
    out: Annotated[str | None, typer.Option(
        "--out", "-o", help="The statistics file to write (JSON, everything --json prints); "
        "rewritten every --checkpoint seconds and at the end.", rich_help_panel=OUTPUT)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the statistics of an "
                                         "existing --out: count only the prompts not in it.",
                                         rich_help_panel=OUTPUT)] = False,
    force: Annotated[bool, typer.Option("--force", help="Start over: replace an existing --out "
                                        "statistics file (and a --plot or --save-scales file "
                                        "that fptrace did not write).",
                                        rich_help_panel=OUTPUT)] = False,
    merge: Annotated[bool, typer.Option(
        "--merge", help="INPUTS are statistics files: merge them, in the order given, into one "
        "(exactly what one pass over their prompts gives).", rich_help_panel=OUTPUT)] = False,
    save_scales: Annotated[str | None, typer.Option(
        "--save-scales", help="Also write SmoothQuant's activation scales: every linear "
        "layer's per-channel |x| max, keyed by module name (.safetensors).",
        rich_help_panel=OUTPUT)] = None,
    checkpoint: Annotated[float, typer.Option(
        "--checkpoint", min=0, help="Seconds between two writes of --out while counting.",
        rich_help_panel=OUTPUT)] = 60.0,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", min=1, help="Prompts per "
                                            "forward pass (left-padded; padding is never "
                                            "counted).", rich_help_panel=STATS)] = 8,
    truncate: Annotated[bool, typer.Option(
        "--truncate", help="Keep the last tokens of prompts longer than the context window "
        "(else such a prompt is not counted, and listed).", rich_help_panel=STATS)] = False,
    sinks: Annotated[bool, typer.Option(
        "--sinks/--no-sinks", help="Tally each head's attention on the first positions (runs "
        "the model with eager attention, which holds each layer's (batch, heads, T, T) "
        "weights).", rich_help_panel=STATS)] = True,
    sink_threshold: Annotated[float, typer.Option(
        "--sink-threshold", min=0.0, max=1.0, help="A head is a sink when it gives at least "
        "this share of its attention to one position.", rich_help_panel=STATS)] = 0.3,
    top: Annotated[int, typer.Option("--top", min=1, help="Top channels shown per layer.",
                                     rich_help_panel=STATS)] = 3,
    ray: RayOpt = None,
    workers: WorkersOpt = 1,
    gpus_per_worker: GpusPerWorkerOpt = None,
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Per-channel activation statistics over many prompts.

    Per-channel statistics of every layer's activations over many prompts: massive
    activations, LLM.int8() outlier dimensions, top channels, attention sinks; calibration
    scales for quantizers.

    Exit code 0 when every prompt was counted, 1 when some were not (the statistics file lists
    them), 130 when interrupted (rerun with --resume)."""
    import sys

    from fptrace.commands.stats import core
    from fptrace.render.figures import check_path

    if plot is not None:
        check_path(plot, force=force)
    if save_scales is not None:
        core.check_scales_path(save_scales, force)
    err = stderr_console()
    summary = None
    if merge:
        if resume or ray is not None:
            raise BadInput("--merge reads statistics files; --resume and --ray count prompts")
        import contextlib

        from fptrace.locks import exclusive

        with contextlib.ExitStack() as guard:
            if out is not None:
                _check_new_out(out, force)
                guard.enter_context(exclusive(out, "stats"))
            result = core.merge_files(inputs, sink_threshold=sink_threshold, top=top)
            if out is not None:
                core.write_stats(out, result)
    else:
        result, summary = _count(inputs, opts, out=out, resume=resume, force=force, sinks=sinks,
                                 batch_size=batch_size, truncate=truncate, checkpoint=checkpoint,
                                 sink_threshold=sink_threshold, top=top, ray=ray,
                                 workers=workers, gpus_per_worker=gpus_per_worker)
    if result is None:  # interrupted before anything was counted
        fail("interrupted before any statistics came back; nothing was written", 130)
    if save_scales is not None:
        n = core.save_scales(result, save_scales)
        err.print(f"[dim]wrote {n} activation scales to {save_scales}[/dim]", soft_wrap=True)
    if summary is not None:
        rate = summary.tokens / summary.seconds if summary.seconds > 0 else 0.0
        err.print(f"counted {summary.traced}, failed {summary.failed}, skipped "
                  f"{summary.skipped}" + (f" (already in {out})" if out else "")
                  + f", {summary.seconds:.1f} s ({rate:,.0f} tokens/s)"
                  + (f" → {out}" if out else ""), markup=False, soft_wrap=True)
        failed = result.statistics.failed
        if len(failed) > 5:
            err.print(f"{len(failed)} prompts not counted (statistics.failed); the last 5:",
                      markup=False)
        for f in failed[-5:]:
            err.print(f"not counted: {f.id} ({f.source}): {f.error}", markup=False,
                      soft_wrap=True)
        if summary.interrupted:
            fail("interrupted; " + (f"{out} holds the statistics of every group finished so "
                                    "far: run the same command with --resume to continue"
                                    if out else "nothing was kept (give --out to keep "
                                    "statistics across interruptions)"), 130)
    elif out is not None:
        err.print(f"merged {len(inputs)} files ({result.prompts} prompts) → {out}",
                  markup=False, soft_wrap=True)
    if plot is not None:
        from fptrace.commands.stats.render import stats_figure

        write_plot(stats_figure(result)[0], plot, force)
    if as_json:
        from fptrace.render.json import to_json

        sys.stdout.write(to_json(result, indent=None) + "\n")
    else:
        from fptrace.commands.stats.render import stats_view

        show(lambda width: stats_view(result, width), wide)
    if summary is not None and summary.failed:
        raise typer.Exit(1)


def _check_new_out(out: str, force: bool) -> None:
    import os

    from fptrace.atomic import check_target
    from fptrace.core.activation_stats import read_document

    check_target(out, "--out", "stats.json", force=True)  # whose file it is: read_document
    if os.path.exists(out):
        read_document(out)  # never replace a file that is not statistics
        if not force:
            raise BadInput(f"--out {out} exists: pass --force to replace it, or choose another "
                           "--out")


def _count(inputs: list[str], opts: LoadOptions, *, out: str | None, resume: bool,
           force: bool, sinks: bool, batch_size: int, truncate: bool, checkpoint: float,
           sink_threshold: float, top: int, ray: str | None, workers: int,
           gpus_per_worker: float | None):
    from fptrace.commands.stats import core
    from fptrace.models.registry import resolve
    from fptrace.render.progress import prompts_progress

    err = stderr_console()
    elsewhere = shape = None
    if ray is not None:
        import dataclasses
        import functools

        from fptrace.families.parts import dims
        from fptrace.models.sources import load_config

        elsewhere = functools.partial(core.collect_on_ray, address=ray, workers=workers,
                                      gpus_per_worker=gpus_per_worker,
                                      load=dataclasses.asdict(opts))

        def shape() -> tuple[int, int]:
            dm = dims(load_config(resolve(opts.model)))
            return dm.n_layers, dm.n_heads

    return core.stats_run(
        inputs, out=out, resume=resume, force=force, load=lambda: load(opts),
        model_name=resolve(opts.model).name, random_weights=opts.random_weights, sinks=sinks,
        batch_size=batch_size, truncate=truncate, checkpoint_every=checkpoint,
        sink_threshold=sink_threshold, top=top,
        progress=lambda todo: prompts_progress(err, todo, "counting"), elsewhere=elsewhere,
        shape=shape)
