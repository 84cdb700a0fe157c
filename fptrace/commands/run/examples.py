"""Examples of `fptrace run`: its golden view, its bad inputs, its notes' cases."""

from __future__ import annotations

from typing import Any

from fptrace.examples import Bench, NoteCase


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
    prompt = "The cat sat on the mat"
    return _tokenizer_sentences(run_trace(lm, lm.encode(prompt))), \
        _tokenizer_sentences(run_trace(lm, prompt))


NOTE_CASES = (NoteCase("tokenized", _tokenized),)
