"""The notes of `fptrace graph` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

NO_ERROR_NODES = note(
    "graph_no_error_nodes", ("graph",),
    "graph --neurons (always: the freezing is exact)",
    "no error nodes: with attention patterns, norm scales and neuron gates frozen the model is "
    "linear between neurons, so the replacement and completeness scores are 1 by construction; "
    "the neurons that are not nodes are summed in each site's remainder (`other neurons`)")

