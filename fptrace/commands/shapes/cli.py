"""`fptrace shapes`."""

from __future__ import annotations

from typing import Annotated

import typer

from fptrace.cli.io import Group, command, emit_json, quiet_libraries, show, stderr_console
from fptrace.cli.options import STATS, JsonOpt, WideOpt
from fptrace.models.registry import RESOLUTION_HELP


@command(order=20, group=Group.trace, docs="shapes",
         examples=('fptrace shapes --model llama-3.1-8b "The capital of France is"',))
def shapes(
    prompt: Annotated[str | None, typer.Argument(help="Text to tokenize offline "
                                                    "(optional; else --seq-len).")] = None,
    model: Annotated[str, typer.Option("--model", "-m", help=RESOLUTION_HELP,
                                       rich_help_panel="Model")] = "gpt2",
    seq_len: Annotated[int | None, typer.Option("--seq-len", "-T", help="Sequence length "
                                                   "when no prompt is given (default 8).",
                                                   rich_help_panel=STATS)] = None,
    batch: Annotated[int, typer.Option("--batch", "-B", help="Batch size.",
                                       rich_help_panel=STATS)] = 1,
    dtype: Annotated[str, typer.Option("--dtype", help="Precision of activations for the "
                                       "memory figures: float32, bfloat16 or float16.",
                                       rich_help_panel=STATS)] = "float32",
    gpu_memory: Annotated[str | None, typer.Option(
        "--gpu-memory", help="Plan for GPUs of this memory (e.g. 80GiB): how many the weights "
        "and the KV cache need, and the smallest valid --tp.", rich_help_panel=STATS)] = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Shapes, parameters, memory and FLOPs, without the weights.

    Shape flow, parameters, memory and FLOPs of a model, without reading its weights."""
    quiet_libraries()
    from fptrace.commands.shapes.core import shape_report

    err = stderr_console()
    report = shape_report(model, prompt, seq_len=seq_len, batch=batch, dtype=dtype,
                          warn=lambda m: err.print(f"warning: {m}", style="yellow"),
                          gpu_memory=gpu_memory)
    if as_json:
        emit_json(report)
        return
    from fptrace.commands.shapes.render import shape_view

    show(lambda width: shape_view(report, width), wide)
