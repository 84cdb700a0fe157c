"""Examples of `fptrace shapes`: its golden view, its bad inputs, its notes' cases."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from fptrace.examples import Bench, Case, NoteCase, Render, Said, Setup, View

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel


def _beyond_context(bench: Bench) -> Said:
    from fptrace.commands.shapes.core import shape_report

    return shape_report("gpt2", seq_len=8).notes, shape_report("gpt2", seq_len=2000).notes


NOTE_CASES = (NoteCase("shapes_beyond_context", _beyond_context),)


def _view(lm: LoadedModel, bench: Bench) -> Render:
    from fptrace.commands.shapes.core import shape_report
    from fptrace.commands.shapes.render import shape_view

    report = dataclasses.replace(shape_report("gpt2", seq_len=6), seconds=0.0)  # no timing
    return lambda w: shape_view(report, w)


VIEWS = (View("shapes", _view),)


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace shapes` (rows of docs/bad-inputs.md; the files they read are
    made by scripts/bad_inputs.py)."""
    return (
        Case(1, "shapes: negative --seq-len", ("shapes", "--seq-len", "-3")),
        Case(2, "shapes: no offline tokenizer", ("shapes", "hello", "--model", "mistral-7b")),
    )
