"""Examples of `fptrace shapes`: its golden view, its bad inputs, its notes' cases."""

from __future__ import annotations

from typing import Any

from fptrace.examples import Bench, NoteCase


def _beyond_context(bench: Bench) -> tuple[Any, Any]:
    from fptrace.commands.shapes.core import shape_report

    return shape_report("gpt2", seq_len=8).notes, shape_report("gpt2", seq_len=2000).notes


NOTE_CASES = (NoteCase("shapes_beyond_context", _beyond_context),)
