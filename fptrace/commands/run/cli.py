"""`fptrace run`: the Typer command."""

from __future__ import annotations

from typing import Annotated

import typer

from fptrace.cli.io import Group, output, prompt_command
from fptrace.cli.options import (
    STATS,
    ChatOptions,
    LoadOptions,
    Outputs,
    SnippetOpt,
    TopKOpt,
    engine_options,
)
from fptrace.cli.page import write_page
from fptrace.engines import EngineChoice, RunRequest
from fptrace.errors import BadInput


@prompt_command(order=10, group=Group.trace, docs="run",
                examples=('fptrace run "The capital of France is" -k 5',
                          'fptrace run --chat "What is the capital of France?" -k 3'), tp=True)
@engine_options()
def run(
    prompt: Annotated[str | None, typer.Argument(
        help="The text to trace (or --messages FILE).")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
    top_k: TopKOpt = 10,
    snippet: SnippetOpt = 4,
    all_positions: Annotated[bool, typer.Option(
        "--all-positions", help="Compute the LM head for every position, not only the last.",
        rich_help_panel=STATS)] = False,
    truncate: Annotated[bool, typer.Option(
        "--truncate", help="Keep the last tokens of a prompt longer than the context window.",
        rich_help_panel=STATS)] = False,
    outputs: Outputs = Outputs(),
    engine: EngineChoice = EngineChoice(),
) -> None:
    """Trace a prompt block by block: stream, logit lens, top-k.

    Trace PROMPT through the model: tokens, shapes, per-layer residual stream, top-k."""
    chosen = engine.engine
    flag = chosen.refused({
        "--chat/--system/--messages": chat.chat or chat.system is not None or
        chat.messages is not None,
        "--random-weights": opts.random_weights, "--tp": opts.tp, "--quantize": opts.quantize,
        "--device-map": opts.device_map, "--all-positions": all_positions,
        "--truncate": truncate, "--plot": outputs.plot, "--html": outputs.html, **engine.given})
    if flag is not None:
        raise BadInput(f"{flag} is not available with --engine {chosen.name}")
    traced = chosen.trace(RunRequest(prompt, opts, chat, top_k=top_k, snippet=snippet,
                                     all_positions=all_positions, truncate=truncate,
                                     plot=outputs.plot, html=outputs.html, force=outputs.force,
                                     settings=engine.settings))
    trace = traced.trace
    from fptrace.commands.run.render import trace_figure, trace_view

    output(trace, trace_view, outputs, figure=trace_figure)
    if traced.lm is not None:  # an engine that loads no model refuses --html
        assert traced.prompt is not None  # a model is loaded with the prompt it ran
        write_page(outputs.html, traced.lm, traced.prompt, "run", trace, trace)
    if trace.first_nonfinite:
        from fptrace.errors import NonFiniteValues

        raise NonFiniteValues(f"NaN or Inf first appeared at {trace.first_nonfinite}")
