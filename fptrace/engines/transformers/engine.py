"""The transformers engine (ENGINE, fptrace/engines/__init__.py), the default: the checkpoint
loaded in transformers, every block hooked (core/trace.py). As diff's side b it is diff's own
comparisons (two prompts, two settings, --deep), so it declares no `compare`."""

from __future__ import annotations

from fptrace.engines import OPTIONAL, Engine, RunRequest, Traced


def trace(request: RunRequest) -> Traced:
    from fptrace.cli.io import load_for
    from fptrace.cli.options import Outputs
    from fptrace.core.trace import run_trace

    lm, prompt = load_for(request.prompt, request.opts, request.chat,
                          Outputs(plot=request.plot, html=request.html, force=request.force))
    traced = run_trace(lm, prompt, top_k=request.top_k, snippet=request.snippet,
                       all_positions=request.all_positions, truncate=request.truncate,
                       lens_grid=request.plot is not None or request.html is not None)
    return Traced(traced, lm, prompt)


ENGINE = Engine(
    name="transformers", order=0,
    help="the checkpoint loaded in transformers, every block hooked (the default)",
    takes=frozenset(OPTIONAL), trace=trace)
