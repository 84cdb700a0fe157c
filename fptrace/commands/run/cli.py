"""`fptrace run`: the Typer command."""

from __future__ import annotations

from typing import Annotated

import typer

from fptrace.cli.io import Group, command, load_for, output
from fptrace.cli.options import (
    STATS,
    ChatOptions,
    Engine,
    EngineOpt,
    FlashAttn,
    FlashAttnOpt,
    ForceOpt,
    HtmlOpt,
    JsonOpt,
    KvCache,
    KvCacheOpt,
    LoadOptions,
    PlotOpt,
    WideOpt,
    chat_options,
    model_options,
)
from fptrace.cli.page import write_page


@command(order=10, group=Group.trace, docs="run",
         examples=('fptrace run "The capital of France is" -k 5',
                   'fptrace run --chat "What is the capital of France?" -k 3'))
@chat_options()
@model_options(tp=True)
def run(
    prompt: Annotated[str | None, typer.Argument(
        help="The text to trace (or --messages FILE).")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, help="How many next tokens.",
                                       rich_help_panel=STATS)] = 10,
    snippet: Annotated[int, typer.Option("--snippet", min=0, help="First values of the last "
                                         "position shown per layer.",
                                         rich_help_panel=STATS)] = 4,
    all_positions: Annotated[bool, typer.Option(
        "--all-positions", help="Compute the LM head for every position, not only the last.",
        rich_help_panel=STATS)] = False,
    truncate: Annotated[bool, typer.Option(
        "--truncate", help="Keep the last tokens of a prompt longer than the context window.",
        rich_help_panel=STATS)] = False,
    plot: PlotOpt = None,
    html: HtmlOpt = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
    engine: EngineOpt = Engine.transformers,
    flash_attn: FlashAttnOpt = FlashAttn.auto,
    kv_cache: KvCacheOpt = KvCache.f16,
) -> None:
    """Trace a prompt block by block: stream, logit lens, top-k.

    Trace PROMPT through the model: tokens, shapes, per-layer residual stream, top-k."""
    if engine == Engine.llamacpp:
        from fptrace.commands.run.llamacpp import trace_llamacpp

        trace = trace_llamacpp(prompt, opts, chat, flash_attn=flash_attn.value,
                               kv_cache=kv_cache.value,
                               top_k=top_k, snippet=snippet, **{
                                   "--all-positions": all_positions, "--truncate": truncate,
                                   "--plot": plot, "--html": html})
    else:
        lm, prompt = load_for(prompt, opts, plot, chat, force, html)
        from fptrace.core.trace import run_trace

        trace = run_trace(lm, prompt, top_k=top_k, snippet=snippet,
                          all_positions=all_positions, truncate=truncate,
                          lens_grid=plot is not None or html is not None)
    from fptrace.commands.run.render import trace_figure, trace_view

    output(trace, trace_view, as_json=as_json, wide=wide, plot=plot, figure=trace_figure,
           force=force)
    if engine != Engine.llamacpp:  # llama.cpp's trace refuses --html: no model loaded here
        write_page(html, lm, prompt, "run", trace, trace)
    if trace.first_nonfinite:
        from fptrace.errors import NonFiniteValues

        raise NonFiniteValues(f"NaN or Inf first appeared at {trace.first_nonfinite}")




