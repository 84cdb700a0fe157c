"""The notes of `fptrace shapes` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

BEYOND_CONTEXT = note(
    "shapes_beyond_context", ("shapes",),
    "the sequence length asked for is beyond the model's context window",
    "sequence length {n} is beyond the context window of {model} ({ctx})")
