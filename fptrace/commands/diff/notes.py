"""The notes of `fptrace diff` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

DIFF_MODELS = note(
    "diff_models", ("diff",),
    "the two traces come from different models (name or source)",
    "different models: {a} ({source_a}) and {b} ({source_b})")

DIFF_RANDOM = note(
    "diff_random", ("diff",),
    "one of the two traces ran with random weights",
    "RANDOM WEIGHTS in {which}")

DIFF_BLOCKS = note(
    "diff_blocks", ("diff",),
    "the two models have different numbers of blocks",
    "{a} has {la} blocks and {b} {lb}: the rows are compared up to the shorter")

DIFF_WIDTHS = note(
    "diff_widths", ("diff",),
    "the two models' streams have different widths",
    "the streams have different widths ({da} and {db}): no difference or cosine")

DIFF_SNIPPET = note(
    "diff_snippet", ("diff",),
    "a trace file holds only the first values of the stream (saved without --snippet d_model)",
    "a trace holds only the first values of the stream, so the relative difference and cosine "
    "are withheld; save traces with `--snippet D` (D = d_model) to compare them")

DIFF_NONFINITE = note(
    "diff_nonfinite", ("diff",),
    "a trace's stream holds NaN or Inf (a NaN or Inf weight, or an overflow)",
    "{label}'s stream holds NaN or Inf from {where} on: those rows are not compared")

DEEP_BLOCK_LEVEL = note(
    "diff_deep_block_level", ("diff", "report"),
    "with --deep, the two models' blocks have no points to match: models of two families, a "
    "family with no points recorded, or blocks of other shapes",
    "{reason}: the points inside the blocks are not compared, only the block level")

DEEP_MISSING = note(
    "diff_deep_missing_points", ("diff", "report"),
    "with --deep, a point of the family's blocks did not show in one of the runs (an attention "
    "module that returns no weights even when eager)",
    "not compared, as a run did not show them: {points}")

STATS_DIFF_PROMPTS = note(
    "diff_stats_prompts", ("diff",),
    "with --stats, the two statistics files count different prompt ids",
    "the two files count different prompts: the moves mix what the models do differently with "
    "what the prompts do")
