"""The notes of `fptrace graph` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

BLOCKS_WITHOUT_TRANSCODER = note(
    "graph_blocks_without_transcoder", ("graph",),
    "--transcoders holds no transcoder for some blocks",
    "{k} of the {n} blocks have no transcoder ({blocks}): each one's whole MLP output is its "
    "error node at every position, so the graph passes through none of its features")

CLAMPED_NEURONS = note(
    "graph_clamped_neurons", ("graph",),
    "--neurons on gpt-oss: some chosen experts' neurons have their up pre-activation clamped "
    "(|u| beyond the experts' limit) at the prompt's positions",
    "{k} of the chosen experts' neurons (blocks {blocks}) have their up pre-activation clamped "
    "beyond ±{limit:g}: each is a constant under the freezing, so none is a node, and what it "
    "writes is in the bias terms of the nodes it reaches")

FLOAT32_ROWS = note(
    "graph_float32_rows", ("graph",),
    "--precision float32: the rows computed in float32, those that miss their value recomputed",
    "rows computed in float32 (--precision float32), each checked as graph_sums checks it; "
    "recomputed in float64: {n} of the {m} rows (they missed their value by more than its "
    "tolerance) and {k} more for the split over heads (where a kept edge's float32 split "
    "missed the edge: its weight is then its float64 row's, split again in float64)")
