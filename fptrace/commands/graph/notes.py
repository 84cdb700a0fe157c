"""The notes of `fptrace graph` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

BLOCKS_WITHOUT_TRANSCODER = note(
    "graph_blocks_without_transcoder", ("graph",),
    "--transcoders holds no transcoder for some blocks",
    "{k} of the {n} blocks have no transcoder ({blocks}): each one's whole MLP output is its "
    "error node at every position, so the graph passes through none of its features")
