"""Influence, pruning and the graph's scores, by circuit-tracer's definitions (circuit_tracer/
graph.py and attribution.py, safety-research/circuit-tracer), written here in numpy.

The adjacency A is square over the nodes, rows the targets and columns the sources, nodes in
circuit-tracer's order: neurons (their "features"), the per-site remainders (in the place of its
error nodes), tokens, logits. Only the computed nodes' rows are nonzero (tokens, remainders and
error nodes have no incoming edges, and the candidates not computed are folded into their
site's remainder), so A is kept as those rows alone (`Adjacency`): its memory is the computed
rows times the nodes, linear in the prompt's length, where a dense n × n matrix grew with its
square (n is about the layers times the positions: 7,700 nodes, 470 MB a copy, at 256 tokens on
the bundled model). A row normalised is the share of the target's incoming |edges| each
source holds (`normalized`, as its normalize_matrix). A node's influence on the logits is the
sum over every path to a logit of the product of those shares, each logit weighted by its
probability (`influence`, as its compute_influence / compute_node_influence: w·Â + w·Â² + ...).

- `partial_influence` follows its compute_partial_influences (attribution.py): the same sum
  over the rows computed so far, which ranks the neurons whose rows are computed next.
- `prune` follows its prune_graph: nodes kept by cumulative influence (find_threshold at
  node_threshold; tokens and logits always kept), edges by the edge scores of
  compute_edge_influence at edge_threshold, then nodes left without an outgoing edge (neurons,
  remainders) or an incoming one (neurons) dropped until nothing changes.
- `scores` follows its compute_graph_scores: the replacement score (the share of the tokens'
  influence among tokens and error nodes) and the completeness score (the share of each node's
  input not from error nodes, weighted by its influence plus its logit weight).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

MAX_ITER = 1000


@dataclass(frozen=True)
class Adjacency:
    """A square n × n adjacency (rows the targets, columns the sources) whose only nonzero rows
    are `rows` (r, n), the rows of the nodes `index` (r,)."""

    rows: np.ndarray
    index: np.ndarray
    n: int

    @classmethod
    def dense(cls, A: np.ndarray) -> Adjacency:
        """The rows of a dense matrix that are not all zero."""
        import numpy as np

        index = np.flatnonzero(np.abs(A).sum(axis=1) > 0)
        return cls(A[index], index, A.shape[0])

    def normalized(self) -> Adjacency:
        """|A| with each row divided by its sum (rows without input stay zero)."""
        return Adjacency(normalized(self.rows), self.index, self.n)


def normalized(A: np.ndarray) -> np.ndarray:
    """|A| with each row divided by its sum (rows without input stay zero): one new array, the
    division made in place (the rows of a big graph are hundreds of MB a copy)."""
    import numpy as np

    N = np.abs(A)
    N /= np.maximum(N.sum(axis=1, keepdims=True), 1e-10)
    return N


def influence(A: Adjacency, weights: np.ndarray) -> np.ndarray:
    """(n,) each node's influence on the weighted logits: weights·(Â + Â² + ...), Â = A
    normalized. A must be acyclic (it is: an edge always goes up a layer or along a
    position). Weights (k, n), k weightings at once: (k, n)."""
    return partial_influence(A.rows, weights, A.index)


def partial_influence(rows: np.ndarray, weights: np.ndarray, row_nodes: np.ndarray
                      ) -> np.ndarray:
    """Influence over the rows computed so far: rows (r, n) the incoming edges of the nodes
    row_nodes (r,), weights (n,) the logit weights; (n,) each node's influence."""
    return spread(normalized(rows), weights, row_nodes)


def spread(Ah: np.ndarray, weights: np.ndarray, row_nodes: np.ndarray) -> np.ndarray:
    """partial_influence from the rows already normalized, Ah (r, n) (normalized)."""
    # the influence moves from node to node only through the computed rows: the sum over
    # paths Σ_k v_k, v_{k+1} = v_k S (S = Â[:, row_nodes], the square (r, r) part of Â; v_0 the
    # rows' logit weights), spread over every column once at the end, Σ_k v_k Â: the same sum
    # as Σ_k step_k with step_{k+1} = step_k[row_nodes] Â, at r² instead of r·n a step
    v = weights[..., row_nodes].astype(float)  # (r,) or (k, r)
    return paths_sum(Ah, v, row_nodes) @ Ah


def paths_sum(Ah: np.ndarray, v: np.ndarray, row_nodes: np.ndarray) -> np.ndarray:
    """Σ_k v S^k, S = Ah[:, row_nodes]: x = v (I − S)⁻¹, one triangular solve where S is
    strictly triangular in the order of the nodes (every edge between computed nodes goes from
    a node of a lower index to one of a higher: the layouts order the nodes by block, logits
    last), checked before it is used; else (or where the solve's sum is not finite) the sum
    itself, step by step, which ends where the graph is acyclic (MAX_ITER steps at most). A
    graph of 5,000 computed nodes takes about 30 steps, each a pass over S's 200 MB: the solve is
    one."""
    import numpy as np
    import torch

    order = np.argsort(row_nodes, kind="stable")
    S = Ah[np.ix_(order, row_nodes[order])]  # rows (targets) and columns (sources) by node
    if _strictly_lower(S):
        np.negative(S, out=S)  # I − S with its unit diagonal implied (S's diagonal is 0)
        B = torch.from_numpy(np.ascontiguousarray(np.atleast_2d(v)[:, order]))
        x = torch.linalg.solve_triangular(torch.from_numpy(S), B, upper=False, left=False,
                                          unitriangular=True).numpy()
        if np.isfinite(x).all():
            out = np.empty_like(x)
            out[:, order] = x
            return out if v.ndim == 2 else out[0]
        np.negative(S, out=S)
    square = np.empty_like(S)  # S in the rows' own order
    square[np.ix_(order, order)] = S
    del S
    acc = np.zeros_like(v)
    for _ in range(MAX_ITER):
        if not v.any():
            return acc
        acc += v
        v = v @ square
    raise RuntimeError("influence did not converge: the graph has a cycle")


def _strictly_lower(S: np.ndarray, chunk: int = 256) -> bool:
    """Whether S (r, r) is zero on and above its diagonal (a chunk of rows at a time)."""
    import numpy as np

    r = S.shape[0]
    cols = np.arange(r)
    for a in range(0, r, chunk):
        block = S[a:a + chunk]
        if np.any((block != 0) & (cols[None, :] >= np.arange(a, a + len(block))[:, None])):
            return False
    return True


def find_threshold(scores: np.ndarray, fraction: float) -> float:
    """The score above which the largest scores hold `fraction` of their sum."""
    import numpy as np

    s = np.sort(scores.ravel())[::-1]
    total = s.sum()
    if total <= 0:
        return 0.0
    # the first place where the running sum reaches `fraction` of the total, the running sum
    # made a chunk at a time (each chunk's accumulation starting from the sum before it: the
    # same additions in the same order as np.cumsum of the whole), so that a big graph's
    # edge scores (hundreds of MB) are not copied twice more
    i, carry = len(s), 0.0
    for start in range(0, len(s), CHUNK):
        c = np.cumsum(np.concatenate(([carry], s[start:start + CHUNK])))[1:]
        carry = float(c[-1])
        c /= total
        j = int(np.searchsorted(c, fraction))
        if j < len(c):
            i = start + j
            break
    return float(s[min(i, len(s) - 1)])


CHUNK = 1 << 20  # scores a chunk of find_threshold's running sum


@dataclass(frozen=True)
class Pruned:
    """Which nodes and edges a pruning keeps, and each node's cumulative influence (the share of
    the total influence held by the nodes at least as influential: circuit-tracer's
    `influence` in its JSON)."""

    nodes: np.ndarray  # (n,) bool
    edges: np.ndarray  # (r, n) bool, the rows of A.index (the targets)
    influence: np.ndarray  # (n,) the node influence
    cumulative: np.ndarray  # (n,)


def prune(A: Adjacency, weights: np.ndarray, n_neurons: int, n_rest: int, node_threshold: float,
          edge_threshold: float, inf: np.ndarray | None = None) -> Pruned:
    """circuit-tracer's prune_graph on A (nodes: n_neurons neurons, then n_rest remainders,
    then tokens and logits, where `weights` is nonzero); inf: influence(A, weights) where the
    caller has it already."""
    import numpy as np

    inf = influence(A, weights) if inf is None else inf
    n = A.n
    fixed = n_neurons + n_rest  # tokens and logits from here on: always kept
    nodes = inf >= find_threshold(inf, node_threshold)
    nodes[fixed:] = True
    P = A.rows.copy()
    P[~nodes[A.index]] = 0
    P[:, ~nodes] = 0
    nonzero = P != 0
    # Â of the kept nodes (normalized, made in P itself); then, in place, the edges' scores
    # (each copy of the rows is hundreds of MB in a big graph: as few as can be)
    edge_scores = np.abs(P, out=P)
    edge_scores /= np.maximum(edge_scores.sum(axis=1, keepdims=True), 1e-10)
    edge_scores *= (spread(edge_scores, weights, A.index) + weights)[A.index][:, None]
    edges = edge_scores >= find_threshold(edge_scores, edge_threshold)
    del edge_scores
    edges &= nonzero
    while True:
        before = nodes.copy()
        edges[~nodes[A.index]] = False
        edges[:, ~nodes] = False
        nodes[:fixed] &= edges[:, :fixed].any(axis=0)  # an outgoing edge
        incoming = np.zeros(n, dtype=bool)
        incoming[A.index] = edges.any(axis=1)
        nodes[:n_neurons] &= incoming[:n_neurons]  # an incoming edge
        if (nodes == before).all():
            break
    order = np.argsort(-inf, kind="stable")
    cum = np.zeros(n)
    total = inf.sum()
    cum[order] = np.cumsum(inf[order]) / total if total > 0 else 0.0
    return Pruned(nodes=nodes, edges=edges, influence=inf, cumulative=cum)


def scores(An: Adjacency, inf: np.ndarray, weights: np.ndarray, errors: np.ndarray,
           tokens: np.ndarray) -> tuple[float, float]:
    """(replacement, completeness) as circuit-tracer's compute_graph_scores, with the nodes
    `errors` (bool mask) in the role of its error nodes and `tokens` (bool mask) its tokens;
    An: the adjacency normalized (A.normalized()), inf: its influence (spread(An.rows, weights,
    An.index)), made once by the caller for every score and the pruning. Without error nodes
    both are 1."""
    import numpy as np

    A, Ah = An, An.rows
    tok, err = float(inf[tokens].sum()), float(inf[errors].sum())
    replacement = tok / (tok + err) if tok + err > 0 else 1.0
    own = np.ones(A.n)  # a row without input takes nothing from an error node
    own[A.index] = 1.0 - Ah[:, errors].sum(axis=1)
    out = inf + weights
    completeness = float((own * out).sum() / out.sum()) if out.sum() > 0 else 1.0
    return replacement, completeness


__all__ = ["Adjacency", "Pruned", "find_threshold", "influence", "normalized",
           "partial_influence", "paths_sum", "prune", "scores", "spread"]
