"""Examples of `fptrace run`: its golden view, its bad inputs, its notes' cases."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from fptrace.examples import Bench, NoteCase, View

PROMPT = "The cat sat on the mat"


def _tokenizer_sentences(t: Any) -> list[str]:
    """The token-table sentences about tokenizing, in the rendered run view."""
    import io

    from rich.console import Console

    from fptrace.commands.run.notes import TOKENIZED
    from fptrace.commands.run.render import trace_view

    c = Console(file=io.StringIO(), width=200, color_system=None)
    c.print(trace_view(t, 200))
    text = " ".join(c.file.getvalue().split())
    return [m.group(0) for m in TOKENIZED.pattern().finditer(text)]


def _tokenized(bench: Bench) -> tuple[Any, Any]:
    from fptrace.core.trace import run_trace
    from fptrace.models.loading import load_model

    lm = load_model(bench.gpt2_folder(), random_weights=True, device="cpu")
    return _tokenizer_sentences(run_trace(lm, lm.encode(PROMPT))), \
        _tokenizer_sentences(run_trace(lm, PROMPT))


NOTE_CASES = (NoteCase("tokenized", _tokenized),)


def _view(lm: Any, bench: Bench) -> Callable[[Any], Any]:
    from fptrace.commands.run.render import trace_view
    from fptrace.core.trace import run_trace

    trace = dataclasses.replace(run_trace(lm, PROMPT, top_k=5), tokenize_seconds=50e-6)
    return lambda w: trace_view(trace, w)  # the tokenizer's time masked: 50 µs


VIEWS = (View("run", _view),)
