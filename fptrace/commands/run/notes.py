"""The notes of `fptrace run` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

TOKENIZED = note(
    "tokenized", ("run",),
    "the prompt was given as text (not as token ids) and tokenized in this run",
    "the tokenizer is a lookup outside the network (which sees only these ids); it ran on the "
    "CPU before the model, and takes {time} on this text (timed warm)")
