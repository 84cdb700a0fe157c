"""Examples of `fptrace run`: its golden view, its bad inputs, its notes' cases."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from fptrace.examples import Bench, Case, NoteCase, Render, Said, Setup, View

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

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


def _tokenized(bench: Bench) -> Said:
    from fptrace.core.trace import run_trace
    from fptrace.models.loading import load_model

    lm = load_model(bench.gpt2_folder(), random_weights=True, device="cpu")
    return _tokenizer_sentences(run_trace(lm, lm.encode(PROMPT))), \
        _tokenizer_sentences(run_trace(lm, PROMPT))


NOTE_CASES = (NoteCase("tokenized", _tokenized),)


def _view(lm: LoadedModel, bench: Bench) -> Render:
    from fptrace.commands.run.render import trace_view
    from fptrace.core.trace import run_trace

    trace = dataclasses.replace(run_trace(lm, PROMPT, top_k=5), tokenize_seconds=50e-6)
    return lambda w: trace_view(trace, w)  # the tokenizer's time masked: 50 µs


VIEWS = (View("run", _view),)


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace run` (rows of docs/bad-inputs.md; the files they read are
    made by scripts/bad_inputs.py)."""
    m = at.model
    p = at.path
    return (
        Case(1, "empty prompt", ("run", "  ")),
        # bytes that are not UTF-8 reach Python as lone surrogates (surrogateescape)
        Case(2, "invalid UTF-8 bytes in the prompt", ("run", b"caf\xe9", *m)),
        Case(3, "prompt longer than the context", ("run", "word " * 100, *m)),
        Case(4, "unknown model", ("run", "hi", "--model", "gpt-3")),
        Case(5, "missing .gguf file", ("run", "hi", "--model", p("nope.gguf"))),
        Case(6, "corrupt .gguf file", ("run", "hi", "--model", p("random.gguf"))),
        Case(7, "hub id not in the cache, offline", ("run", "hi", "--model", "nobody/nothing")),
        Case(8, "pickle weights", ("run", "hi", "--model", p("pickle"))),
        Case(9, "model code without --trust-remote-code", ("run", "hi", "--model", p("remote"))),
        Case(10, "unknown device", ("run", "hi", *m, "--device", "tpu")),
        Case(11, "CUDA asked for, none here", ("run", "hi", *m, "--device", "cuda")),
        Case(12, "unknown dtype", ("run", "hi", *m, "--dtype", "float8")),
        Case(13, "malformed --max-memory",
             ("run", "hi", *m, "--device-map", "auto", "--max-memory", "0=lots")),
        Case(14, "--top-k 0", ("run", "hi", *m, "--top-k", "0")),
        Case(15, "--snippet -1", ("run", "hi", *m, "--snippet", "-1")),
        Case(16, "plot into a missing folder", ("run", "hi", *m, "--plot", p("no", "t.png"))),
        Case(17, "plot format the extension does not name",
             ("run", "hi", *m, "--plot", p("t.xyz"))),
        Case(18, "not an integer", ("run", "hi", *m, "--top-k", "many")),
        Case(19, "--chat on a model without a chat template", ("run", "--chat", "hi", *m)),
        Case(20, "--chat and --messages together",
             ("run", "--chat", "--messages", p("messages.json"), *m)),
        Case(23, "--max-memory: a GPU number in Unicode digits",
             ("run", "hi", *m, "--device-map", "auto", "--max-memory", "\u00b2=1GiB")),
        Case(24, "run --messages: 100,000 nested lists", ("run", *m, "--messages", p("deep.json"))),
        Case(25, "run --messages: an unknown role", ("run", *m, "--messages", p("robot.json"))),
        Case(26, "run: --system is empty", ("run", "hi", *m, "--system", "")),
        Case(27, "run --plot onto someone else's file",
             ("run", "hi", *m, "--plot", p("notes.txt"))),
        Case(21, "a messages file with a message lacking its content",
             ("run", "--messages", p("messages.json"), *m)),
        Case(22, "a missing messages file", ("run", "--messages", p("nope.json"), *m)),
        Case(28, "run: a GGUF with block_count 0 in transformers",
             ("run", "hi", "-m", p("blocks0.gguf"))),
        Case(29, "--ids-file: 10⁶ ids, beyond the context",
             ("run", "--ids-file", p("ids-1e6.txt"), *m)),
        Case(30, "both a prompt and --ids", ("run", "The cat", "--ids", "5,6", *m)),
    )
