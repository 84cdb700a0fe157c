"""The strongest paths from a token to a logit through a pruned graph.

A path's strength is its term of the token's influence (influence.py): the product of each
edge's share of its target's input (|edge| / Σ|edges into the target| in the unpruned graph),
times the logit's probability. The k strongest are found by dynamic programming from the
logits down, layer by layer (an edge always goes to a later layer, or from a token).
"""

from __future__ import annotations

from typing import Any

from fptrace.commands.graph.influence import Adjacency
from fptrace.commands.graph.result import GraphPath


def strongest_paths(A: Adjacency, edges: Any, kept: Any, weights: Any, ids: list[str],
                    layer_of: list[int], k: int = 5) -> list[GraphPath]:
    """The k strongest token-to-logit paths over the kept nodes and edges of A (edges: the
    kept edges of A's rows, bool (r, n)); layer_of: each node's layer (tokens -1, logits past
    the last block)."""
    import numpy as np

    Ah = A.normalized().rows
    row_of = {int(t): r for r, t in enumerate(A.index)}
    best: dict[int, list[tuple[float, list[int]]]] = {
        int(i): [(float(weights[i]), [int(i)])] for i in np.flatnonzero(weights) if kept[i]}
    order = sorted((int(i) for i in np.flatnonzero(kept) if weights[i] == 0),
                   key=lambda i: -layer_of[i])
    for s in order:
        found = []
        for r in np.flatnonzero(edges[:, s]):
            t = int(A.index[r])
            for strength, path in best.get(t, ()):
                found.append((strength * float(Ah[r, s]), [s, *path]))
        found.sort(key=lambda x: -x[0])
        if found:
            best[s] = found[:k]
    starts = [(st, path) for s in order if layer_of[s] == -1 for st, path in best.get(s, ())]
    starts.sort(key=lambda x: -x[0])
    return [GraphPath(nodes=tuple(ids[i] for i in path), strength=st,
                      weights=tuple(float(A.rows[row_of[path[j + 1]], path[j]])
                                    for j in range(len(path) - 1)))
            for st, path in starts[:k]]


__all__ = ["strongest_paths"]
