"""The notes of `fptrace explain` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

END_OF_PASS = note(
    "explain_end_of_pass", ("explain", "report", "tui"),
    "the explained block is not the model's last",
    "the end of the pass starts from the model's own output of its last block (block {last}), "
    "not from the recomputed block {layer}")

MATRIX_LIMIT = note(
    "explain_matrix_limit", ("explain", "report", "tui"),
    "the prompt has more tokens than the attention tables show",
    "the attention tables are shown for prompts of at most {n} tokens")
