"""`fptrace batch`."""

from __future__ import annotations

from typing import Annotated

import typer

from fptrace.cli.io import Group, command, fail, launch_ranks, load, stderr_console
from fptrace.cli.options import (
    OUTPUT,
    STATS,
    GpusPerWorkerOpt,
    LoadOptions,
    RayOpt,
    SnippetOpt,
    TopKOpt,
    WorkersOpt,
    model_options,
)
from fptrace.errors import BadInput


@command(order=80, group=Group.compare, docs="batch",
         examples=('fptrace batch prompts/capitals.txt prompts/stories.jsonl --out traces.jsonl',))
@model_options(tp=True)
def batch(
    inputs: Annotated[list[str], typer.Argument(
        help=".txt files (one prompt per line), .jsonl files ({\"id\": ..., \"prompt\": ...} "
        "per line, other fields carried into the record), folders of them, or - for stdin.",
        show_default=False)],
    out: Annotated[str, typer.Option("--out", "-o", help="The JSON Lines file to write (or - "
                                     "for stdout). An existing one is resumed.",
                                     rich_help_panel=OUTPUT)],
    opts: LoadOptions,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", min=1, help="Prompts per "
                                            "forward pass (left-padded, with an attention "
                                            "mask).", rich_help_panel=STATS)] = 8,
    top_k: TopKOpt = 10,
    snippet: SnippetOpt = 4,
    truncate: Annotated[bool, typer.Option(
        "--truncate", help="Keep the last tokens of prompts longer than the context window "
        "(else such a prompt is an error record).", rich_help_panel=STATS)] = False,
    force: Annotated[bool, typer.Option("--force", help="Start over: empty an existing --out "
                                        "file of fptrace records instead of resuming it.",
                                        rich_help_panel=OUTPUT)] = False,
    ray: RayOpt = None,
    workers: WorkersOpt = 1,
    gpus_per_worker: GpusPerWorkerOpt = None,
) -> None:
    """Trace many prompts into resumable JSON Lines.

    Trace many prompts into JSON Lines, one record per prompt; rerun to resume.

    Exit code 0 when every prompt was traced, 1 when some failed (their records carry an
    `error` field), 130 when interrupted (rerun the same command to resume)."""
    from fptrace.commands.batch.core import batch_file
    from fptrace.models.registry import resolve
    from fptrace.render.progress import prompts_progress

    launch_ranks(opts)  # before the output file is opened and locked
    err = stderr_console()
    on_ray = None
    if ray is not None:
        import dataclasses
        import functools

        from fptrace.commands.batch.ray import run_on_ray

        if opts.tp is not None:
            raise BadInput("--ray spreads prompts over workers, --tp one model over processes: "
                           "use one of them")
        on_ray = functools.partial(run_on_ray, address=ray, workers=workers,
                                   gpus_per_worker=gpus_per_worker,
                                   load={**dataclasses.asdict(opts), "tp": None})
    summary = batch_file(inputs, out, load=lambda: load(opts),
                         model_name=resolve(opts.model).name,
                         random_weights=opts.random_weights, force=force,
                         batch_size=batch_size, top_k=top_k, snippet=snippet, truncate=truncate,
                         progress=lambda todo: prompts_progress(err, todo), elsewhere=on_ray)
    where = "stdout" if out == "-" else out
    rate = summary.tokens / summary.seconds if summary.seconds > 0 else 0.0
    err.print(f"traced {summary.traced}, failed {summary.failed}, skipped {summary.skipped} "
              f"(already in {where}), {summary.seconds:.1f} s ({rate:,.0f} tokens/s)"
              + (f"; {summary.nonfinite} with NaN/Inf" if summary.nonfinite else "")
              + f" → {where}", markup=False, soft_wrap=True)
    if summary.interrupted:
        fail(f"interrupted; {where} holds every record finished so far: run the same command "
             "again to resume", 130)
    if summary.failed:
        raise typer.Exit(1)
