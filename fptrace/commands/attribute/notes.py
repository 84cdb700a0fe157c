"""The notes of `fptrace attribute` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

SOFTCAP = note(
    "attribute_softcap", ("attribute", "report", "tui"),
    "the model soft-caps its final logits (Gemma 2/3)",
    "the model soft-caps its logits at {cap:g}: the parts sum to the logit before the cap; the "
    "capped logit is shown beside it")

QK_KEY_DEFAULTED = note(
    "attribute_qk_key_defaulted", ("attribute", "report", "tui"),
    "attribute --qk without --key",
    "the key is the position query {query} attends to most in this head; --key chooses another")

QK_SOFTCAP = note(
    "attribute_qk_softcap", ("attribute", "report", "tui"),
    "attribute --qk on a model that soft-caps its attention scores (Gemma 2)",
    "the model soft-caps attention scores at {cap:g}: the terms sum to the score before the cap; "
    "the softmax reads the capped score")
