"""The notes of `fptrace tokens` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

NOT_IN_TOKENIZER = note(
    "tokens_not_in_tokenizer", ("tokens",),
    "some of the ids given are in the model's vocabulary but beyond its tokenizer's (a "
    "vocabulary padded past the tokenizer's size)",
    "{k} of the ids (the first: {first}) are in the model's vocabulary ({vocab}) but not in its "
    "tokenizer ({known} ids): rows that no text encodes to")
