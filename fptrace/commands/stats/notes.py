"""The notes of `fptrace stats` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

STATS_RANDOM = note(
    "stats_random_weights", ("stats",),
    "the statistics were counted on a model built with --random-weights",
    "RANDOM WEIGHTS: these statistics were counted on randomly initialized weights, not on the "
    "trained model's")

STATS_FAILED = note(
    "stats_failed", ("stats",),
    "some prompts could not be counted (longer than the context without --truncate, unreadable, "
    "NaN/Inf in the pass)",
    "{n} prompt(s) not counted: statistics.failed says why")

STATS_EAGER = note(
    "stats_eager_attention", ("stats",),
    "the attention sinks were tallied (--sinks, the default)",
    "attention weights are the model's own, from transformers' eager attention (the pass ran "
    "with it)")
