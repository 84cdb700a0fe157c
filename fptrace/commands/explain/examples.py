"""Examples of `fptrace explain`: its golden view, its bad inputs, its notes' cases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fptrace.examples import Bench, Case, NoteCase, Render, Said, Setup, View

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

PROMPT = "The cat sat on the mat"


def _explained(lm: LoadedModel, **kw: Any) -> tuple[str, ...]:
    from fptrace.commands.explain.core import explain

    return explain(lm, [5, 6, 7, 8], **kw).notes


def _end_of_pass(bench: Bench) -> Said:
    lm = bench.lm("llama")
    return _explained(lm, layer=-1), _explained(lm, layer=0)


def _matrix_limit(bench: Bench) -> Said:
    lm = bench.lm("llama")
    return _explained(lm), _explained(lm, max_matrix=2)


NOTE_CASES = (NoteCase("explain_end_of_pass", _end_of_pass),
              NoteCase("explain_matrix_limit", _matrix_limit))


def _view(lm: LoadedModel, bench: Bench) -> Render:
    from fptrace.commands.explain.core import explain
    from fptrace.commands.explain.render import explain_view

    e = explain(lm, PROMPT, layer=1, head=1)
    return lambda w: explain_view(e, w)


VIEWS = (View("explain", _view),)


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace explain` (rows of docs/bad-inputs.md; the files they read are
    made by scripts/bad_inputs.py)."""
    m = at.model
    p = at.path
    return (
        Case(1, "--layer out of range", ("explain", "hi", *m, "--layer", "7")),
        Case(2, "--head out of range", ("explain", "hi", *m, "--head", "9")),
        Case(3, "--top-p outside (0, 1]", ("explain", "hi", *m, "--top-p", "1.5")),
        Case(4, "negative temperature", ("explain", "hi", *m, "--temperature", "-1")),
        Case(5, "family with no walkthrough", ("explain", "hi", "--model", p("starcoder2"))),
        Case(6, "missing argument", ("explain",)),
        Case(7, "--ids beyond the vocabulary", ("explain", "--ids", "5,50257", *m)),
    )
