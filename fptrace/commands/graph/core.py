"""`fptrace graph`: an attribution graph of the model's own MLP neurons (`--neurons`) or of
transcoder latents (`--transcoders DIR`: each block's MLP replaced by its transcoder, with one
error node per (block, position): transcoders.py), exact.

1. The model runs once in float64 (model64.py): every neuron's (or latent's) activation, the
   logits.
2. The nodes: the tokens per position; at each (layer, position) the `per_site` neurons of
   largest |activation| (the candidates); the logits of each query position (the top ones
   covering 0.95 of the probability, at most 10, as circuit-tracer's compute_salient_logits; or
   --target's); and per (layer, position) one remainder: the neurons that are not nodes,
   summed, so that nothing is dropped; with transcoders, per (layer, position) its error node.
3. The model runs once more, frozen (freezing.py); the incoming edges of the logits, then of
   the candidates in order of their influence on the logits over the rows computed so far
   (circuit-tracer's attribute with max_feature_nodes), at most max_nodes, come from batched
   backward passes (rows.py); where max_nodes covers every candidate, each one's, unranked
   (circuit-tracer's attribute without max_feature_nodes). A candidate's backward pass runs
   through the frozen pass of the shortest prefix of the prompt that holds its position
   (prefix_ends). Those passes run here, or where `pool` runs them (pool.py: `graph --ray`,
   the batches of one round over a Ray cluster's actors, the same batches, assembled here in
   the same order: the same graph). With precision float32, those passes run on a float32
   copy of the model (copied_passes): each row is checked against the node's float64 value
   (graph_sums' rule, below) as it comes, and one that misses is recomputed in float64.
4. Every computed node is checked: its edges from all sources plus its bias terms equal its
   value in the model within RTOL (float64); the float64 copy's logits equal the model's own.
5. The graph is pruned and scored by circuit-tracer's definitions (influence.py).
6. With `verify` N, the N most influential nodes are removed one at a time (verify.py): every
   computed node must change by minus its edge (checked), and the top logit's real change is
   given beside the graph's prediction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fptrace.commands.graph.experts import (
    ExpertLayout,
    graph_routes,
    layouts,
    neuron_fields,
    neuron_name,
)
from fptrace.commands.graph.freezing import (
    EDGE_MEANING,
    TRANSCODER_EDGE,
    Pass,
    freezing_lines,
    holds_patterns,
    mlp_sites,
)
from fptrace.commands.graph.heads import Source, split, vectors
from fptrace.commands.graph.influence import (
    Adjacency,
    Pruned,
    partial_influence,
    prune,
    scores,
    spread,
)
from fptrace.commands.graph.model64 import Real, float64_copy, real_pass
from fptrace.commands.graph.passes import FrozenPasses, copied_passes
from fptrace.commands.graph.paths import strongest_paths
from fptrace.commands.graph.pool import GraphWork, Job, RowsPool
from fptrace.commands.graph.result import (
    AttributionGraph,
    EdgeHead,
    GraphCheck,
    GraphEdge,
    GraphLogitEffect,
    GraphNode,
    GraphQK,
    GraphScores,
)
from fptrace.commands.graph.rows import Candidates, Rows, Target, rows
from fptrace.commands.graph.transcoders import TranscoderSet, read_transcoders
from fptrace.core.attribution import rtol_for
from fptrace.core.fragments import token_id
from fptrace.core.trace import base_notes, model_info
from fptrace.errors import PromptTooLong, param
from fptrace.models.loading import LoadedModel
from fptrace.models.prompts import Prompt, too_long

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy as np

    from fptrace.addresses import Selection
    from fptrace.models.prompts import Prepared

RTOL = 1e-5  # |Σ edges + bias − value| ≤ RTOL · max(|value|, 1e-6 · Σ|terms|), float64
LOGIT_PROB = 0.95  # logit nodes: the top tokens until they hold this probability ...
MAX_LOGITS = 10  # ... at most this many (circuit-tracer's defaults)
PREFIXES = 4  # a candidate's row comes from the pass of the shortest of this many prefixes
BATCH = 32  # targets per backward pass, at most ...
PASS_BYTES = 1 << 30  # ... and fewer where one pass's gradients would take more (rows_fitting)


def rows_fitting(T: int, L: int, m: int, d: int, most: int, budget: int = PASS_BYTES) -> int:
    """Targets per backward pass: `most`, or fewer so that one batched pass's gradients fit in
    `budget` bytes (backward_bytes a target). With 32 targets a 256-token graph peaked at 10.4
    GB, with 8 at 128 tokens at 3.2 GB instead of 6.6 GB (and ran faster). Memory is then
    linear in the prompt's length. float32 rows take the same batch (sized for their half-size
    gradients, 16 targets at 256 tokens ran slower than 8: docs/graph.md)."""
    return max(1, min(most, budget // max(backward_bytes(T, L, m, d), 1)))


def backward_bytes(T: int, L: int, m: int, d: int) -> int:
    """One target's backward pass over T positions, in bytes: a float64 gradient at every
    block's nodes (m) and stream-wide ones (d) a position. Measured on the bundled model (L 30,
    m 1,536, d 576; a batch of targets at the last block and position, the most a target's pass
    holds; glibc's mmap threshold fixed so that freed memory leaves the process): 1,590 to 1,690
    float64 values a block and position a target at 128 and 256 tokens, against the m + d =
    2,112 counted here."""
    return 8 * T * L * (m + d)


SPLIT_HELD = 4  # stream-wide vectors a frozen pass keeps per block and position for heads.py


def pass_bytes(T: int, L: int, m: int, d: int, nh: int) -> int:
    """One frozen pass over T positions, in bytes, per block and position: 4·m float64 values
    for the MLP (its up pre-activation, the frozen gate, the activation and its leaf), 2·d
    stream-wide (the norms' outputs, the attention's output) and SPLIT_HELD · d for the split
    of the edges over heads (freezing.Pass: each block's input, the stream its MLP reads, what
    its MLP writes and the heads' values), and the frozen pattern's nh·T values where the pass
    holds every block's (freezing.holds_patterns; past it, q and k: 2·d). Measured on the
    bundled model (nh 9; one pass alone, glibc's mmap threshold fixed): 10,700, 10,860 and
    11,990 values a block and position at 64, 128 and 256 tokens, against 10,176, 10,752 and
    11,904 by this count."""
    patterns = nh * T if holds_patterns(1, nh, T, T, 8, L) else 2 * d
    return 8 * T * L * (4 * m + (2 + SPLIT_HELD) * d + patterns)


def vectors_bytes(S: int, L: int, d: int) -> int:
    """What heads.vectors holds for S sources, in bytes, at most: each source's vector in the
    stream (d) and what it adds to each block's values (nh·hd = d a block; only the blocks
    after the source's are kept, about half): 8 · S · (L + 1) · d. About 0.7 GB for 5,000
    sources on the bundled model (L 30, d 576) at most."""
    return 8 * S * (L + 1) * d


def graph_bytes(lm: LoadedModel, g: AttributionGraph, batch_size: int = BATCH,
                transcoders: TranscoderSet | None = None) -> dict[str, int]:
    """What graph() held for `g` at its peak, estimated from the shapes (bytes; the model as
    loaded, and the transcoders as read, not counted): the float64 copy of the model; the
    frozen passes (the whole prompt's and its prefixes': pass_bytes); then the largest of one
    batch's backward pass (rows_fitting's targets × backward_bytes), the assembly (the computed
    rows × the nodes in float64 at once: the rows' buffer, the adjacency's rows where not
    every candidate was computed (else they are the buffer's), the pruning's edge scores and
    their sorted copy (influence.prune, find_threshold), a mask of them; and the rows' square
    part, in influence.spread) and the split over heads (vectors_bytes of the kept edges'
    sources, and one batch's gradients at every block's values). `peak`: their sum so."""
    import torch

    info = model_info(lm)
    L, d = info.n_layers, info.d_model
    T = len(g.tokens)
    width = transcoders.width if transcoders is not None else _mlp_width(lm)
    copy = sum(p.numel() for p in lm.model.parameters()) * torch.finfo(torch.float64).bits // 8
    ends = prefix_ends(T, L, width, d, info.n_heads)
    passes = sum(pass_bytes(e, L, width, d, info.n_heads) for e in ends)
    batch = rows_fitting(T, L, width, d, batch_size)
    backward = batch * backward_bytes(T, L, width, d)
    rows = g.computed + sum(1 for n in g.nodes if n.node_type == "logit")
    n = g.candidates + L * T * (2 if transcoders is not None else 1) + T + rows - g.computed
    copies = 3 if g.computed == g.candidates else 4
    assembly = copies * 8 * rows * n + rows * n + 8 * rows * rows
    sources = len({e.source for e in g.edges})
    # skip transcoders: per source what it adds to each skip term, per target the gradient there
    skips = 0 if transcoders is None else len(transcoders.skips)
    split_ = vectors_bytes(sources, L, d) + batch * 8 * T * (L + 1) * d + \
        8 * (sources + batch * T) * skips * d
    return {"float64_copy": copy, "frozen_passes": passes, "backward": backward,
            "assembly": assembly, "split": split_,
            "peak": copy + passes + max(backward, assembly, split_)}


def _mlp_width(lm: LoadedModel) -> int:
    """The MLP's neurons a block (the widest expert's for a mixture)."""
    cfg = lm.model.config
    return int(getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None)
               or 4 * model_info(lm).d_model)


def prefix_ends(T: int, L: int, m: int, d: int, nh: int, budget: int = PASS_BYTES
                ) -> list[int]:
    """The lengths of the prefixes whose frozen passes give the candidates' rows: the first
    ⌈T·i/PREFIXES⌉ positions, i = 1 … PREFIXES. A target at position t has no edge from a later
    position (the model is causal: its frozen attention gives a later key exactly 0), so its
    backward pass needs only the positions up to t: through the shortest prefix holding t the
    passes cost about 0.6 of the whole prompt's (linear in the positions, more for attention).
    The shorter passes are held beside the whole one (1.5× its memory for four, estimated per
    position: pass_bytes); where that would pass `budget`, the whole prompt's pass alone
    ([T]): a long prompt's memory stays as it was."""
    if 1.5 * pass_bytes(T, L, m, d, nh) > budget:
        return [T]
    return sorted({max(1, -(-T * i // PREFIXES)) for i in range(1, PREFIXES + 1)})


def query_positions(positions: Selection | Sequence[int] | None, n: int) -> list[int]:
    """The query positions of a prompt of n tokens: a Selection (`--positions 3,-1`, `all`) or
    a list of ints (negative ones count from the end), checked against the prompt; default
    (None): the last."""
    from fptrace.addresses import Selection, resolve_selection

    if positions is None:
        return [n - 1]
    got = resolve_selection(positions, n, "positions", "the prompt", "position", "token")
    if got is None and isinstance(positions, Selection):
        return list(range(n))
    return list(got or [n - 1])


def graph(lm: LoadedModel, prompt: Prompt, *,
          positions: Selection | Sequence[int] | None = None, target: str | None = None,
          node_threshold: float = 0.8, edge_threshold: float = 0.98,
          max_nodes: int = 64, per_site: int = 4, batch_size: int = BATCH,
          transcoders: str | TranscoderSet | None = None, verify: int = 0,
          qk: int = 0, pool: RowsPool | None = None,
          precision: str = "float64") -> AttributionGraph:
    """The attribution graph of the prompt's next tokens at the query positions (see the
    module's text): over the MLP neurons, or with `transcoders` (a folder, or a TranscoderSet
    read by transcoders.read_transcoders) over their latents; with `verify`, its N most
    influential nodes removed one at a time (verify.py); with `qk`, the N largest head shares
    of the kept edges with their attention scores split (core/qk.py); with `pool`, the
    backward passes run there (pool.py, ray.py), the graph the same; with `precision`
    "float32", the rows and the split over heads run on a float32 copy of the model, each row
    checked against its float64 value as graph_sums checks it and recomputed in float64 where
    it misses, each split likewise (split_edges; counted in a note)."""
    import numpy as np

    start = time.perf_counter()
    _check_numbers(node_threshold, edge_threshold, max_nodes, per_site, batch_size, verify, qk,
                   precision)
    tset = read_transcoders(transcoders, lm) if isinstance(transcoders, str) else transcoders
    sites = mlp_sites(lm.parts.family) if tset is None else None
    try:
        prepared = lm.prepare(prompt)
    except PromptTooLong as e:  # graph has no --truncate to offer
        raise too_long(e.tokens, e.limit, lm.name, truncate=False) from None
    queries = query_positions(positions, len(prepared.ids))
    fixed = None if target is None else token_id(lm, target, param("target"), prepared)
    ids = list(prepared.ids)[:queries[-1] + 1]
    model, parts = float64_copy(lm)
    real = real_pass(lm, model, parts, sites, ids, queries, tset)
    L, T, m = real.acts.shape
    batch = rows_fitting(T, L, m, model_info(lm).d_model, batch_size)
    k = max(1, min(per_site, m))
    cand = Candidates.top(real.sources, k)
    logit_targets, probs = _logit_nodes(real, fixed, len(queries))
    passes = FrozenPasses(model, parts, sites, tset, ids, queries,  # each made when first
                          outputs=qk > 0)  # used; with --qk, the heads' outputs kept
    fast = passes if precision == "float64" else \
        copied_passes(lm, precision, sites, tset, ids, queries)
    work = GraphWork(tuple(ids), tuple(queries), cand, transcoders, precision)
    recomputed = [0]  # float32 rows that missed their value, recomputed in float64

    def computed(jobs: list[Job]) -> Iterable[Rows]:
        """The seam: each batch's rows, in the jobs' order, here (one at a time, as a pool's
        worker computes them: pool.rows_of) or in the pool; in float32, each batch's rows
        that miss their value recomputed in float64 here (settled)."""
        if pool is not None:
            got = pool.map(work, jobs)
        else:
            got = (rows(fast(job.end), list(job.targets), cand) for job in jobs)
        return got if fast is passes else (settled(job, r) for job, r in zip(jobs, got,
                                                                              strict=True))

    def settled(job: Job, r: Rows) -> Rows:
        """A batch's float32 rows, those that miss their value (graph_sums' test) replaced by
        their float64 rows."""
        miss = np.flatnonzero(r.misses(np.array([value(t) for t in job.targets])) > RTOL)
        if not len(miss):
            return r
        recomputed[0] += len(miss)
        exact = rows(passes(job.end), [job.targets[i] for i in miss], cand)
        return r.with_rows(miss, exact)

    n_cand = len(cand)
    layout = _Layout(cand, len(logit_targets), errors=tset is not None,
                     experts=layouts(parts, None if sites is None else sites.moe))

    def value(t: Target) -> float:
        if t.layer is None:
            return float(real.logits[t.position, t.index])
        return float(real.acts[t.layer, t.position, t.index])

    done: list[tuple[Target, Rows, int]] = []  # (target, its rows (one), its node index)
    budget = min(max_nodes, n_cand)
    matrix = _Matrix(layout, len(logit_targets) + budget)  # their candidate-level rows
    starts = range(0, len(logit_targets), batch)
    jobs = [Job(len(ids), tuple(logit_targets[i:i + batch])) for i in starts]
    for i, job, got in zip(starts, jobs, computed(jobs), strict=True):
        matrix.keep(done, list(job.targets), got,
                    [layout.logit(j) for j in range(i, i + len(job.targets))])
    weights = np.zeros(layout.n)
    weights[layout.logit(0):] = probs
    visited = np.zeros(n_cand, dtype=bool)

    ends = prefix_ends(len(ids), L, m, model_info(lm).d_model, model_info(lm).n_heads)

    def compute(order: np.ndarray) -> None:
        """The rows of the candidates `order`: in batches from the shortest prefix's pass that
        holds their positions, one block at a time mostly."""
        targets = [cand.target(int(c)) for c in order]
        end_of = {t: next(e for e in ends if e > t.position) for t in targets}
        pairs = sorted(zip(targets, order.tolist(), strict=True),
                       key=lambda x: (end_of[x[0]], x[0].layer or 0))
        jobs, nodes = [], []
        for end in ends:
            group = [x for x in pairs if end_of[x[0]] == end]
            for i in range(0, len(group), batch):
                part = group[i:i + batch]
                jobs.append(Job(end, tuple(t for t, _ in part)))
                nodes.append([c for _, c in part])
        for job, got, ns in zip(jobs, computed(jobs), nodes, strict=True):
            matrix.keep(done, list(job.targets), got, ns)
        visited[order] = True

    if budget == n_cand:  # every candidate's row: nothing to rank (circuit-tracer's attribute
        compute(np.arange(n_cand))  # with max_feature_nodes None)
    while int(visited.sum()) < budget:
        infl = partial_influence(matrix.rows, weights, matrix.nodes)[:n_cand]
        infl[visited] = -1
        order = np.argsort(-infl, kind="stable")
        # a round: the 4·batch_size most influential left (the batch asked for, not the one
        # memory allows, so that the graph is the same whatever the prompt's length leaves)
        order = order[infl[order] > 0][:min(4 * batch_size, budget - int(visited.sum()))]
        if not len(order):
            break
        compute(order)
    checks = [_sums_check(done, value, lm, layout), _model_check(real, model_info(lm).dtype)]
    g, ranked = _assemble(lm, prepared, queries, ids, real, done, matrix, visited, weights,
                          checks, node_threshold, edge_threshold, max_nodes, k, start, tset)
    nodes_at: dict[tuple[int, int], list[int]] = {}  # site -> its neurons that are nodes
    for c in np.flatnonzero(visited).tolist():
        nodes_at.setdefault((int(cand.layer[c]), int(cand.position[c])), []).append(
            int(cand.index[c]))
    exact = None if fast is passes else _Exact(passes, cand, ends, len(ids))
    edges, check, redone = split_edges(g, queries, nodes_at, fast, ends, batch, L, exact)
    notes = g.notes
    if exact is not None:
        from fptrace.commands.graph.notes import FLOAT32_ROWS

        notes = (*notes, FLOAT32_ROWS(n=recomputed[0], m=len(done), k=redone))
    g = replace(g, edges=edges, checks=(*g.checks, check), ok=g.ok and check.ok, notes=notes,
                precision=precision, seconds=time.perf_counter() - start)
    if qk:
        scored, qk_check = head_scores(lm, g, qk, queries, ids, nodes_at, passes, ends)
        g = replace(g, qk=scored, checks=(*g.checks, qk_check), ok=g.ok and qk_check.ok,
                    seconds=time.perf_counter() - start)
    if not verify:
        return g
    from fptrace.commands.graph.verify import verify as run_verify

    picked = [n for n in ranked if n.index is not None][:verify]  # computed, by influence
    picks = [Target(n.layer, n.position, n.index) for n in picked if n.index is not None]
    verified, check = run_verify(model, parts, sites, tset, ids, queries, done, cand, picks,
                                 [n.label for n in picked], logit_targets[0], real.acts, RTOL)
    return replace(g, verified=verified, verify_logit=lm.token_text(logit_targets[0].index),
                   checks=(*g.checks, check), ok=g.ok and check.ok,
                   seconds=time.perf_counter() - start)


TOP_HEADS = 4  # heads kept on an edge (by |share|); the others are summed in heads_rest


class _Exact:
    """precision float32: the float64 frozen passes (made when first asked for) and the rows
    the split over heads falls back on (split_edges)."""

    def __init__(self, passes: FrozenPasses, cand: Candidates, ends: list[int],
                 whole: int) -> None:
        self.passes, self.cand, self.ends, self.whole = passes, cand, ends, whole

    def rows(self, targets: list[Target], batch: int) -> dict[Target, Rows]:
        """Each target's float64 Rows (one row), from the pass its float32 row came from."""
        by_end: dict[int, list[Target]] = {}
        for t in targets:
            by_end.setdefault(_pass_end(t, self.ends, self.whole), []).append(t)
        out: dict[Target, Rows] = {}
        for end, ts in sorted(by_end.items()):
            for i in range(0, len(ts), batch):
                part = ts[i:i + batch]
                got = rows(self.passes(end), part, self.cand)
                for b, t in enumerate(part):
                    out[t] = got.row(b)
        return out

    def edge(self, r: Rows, s: Source) -> float:
        """The edge from source s in the one-row Rows r, as the graph's adjacency holds it (a
        remainder: its site's neurons but the computed ones, `left_out`)."""
        if s.layer is None:
            return float(r.tokens[0, s.position])
        if s.error:
            return float(r.errors[0, s.layer, s.position])
        if s.index is not None:
            return float(r.chosen[0, self.cand.columns[Target(s.layer, s.position, s.index)]])
        left = [self.cand.columns[Target(s.layer, s.position, i)] for i in s.left_out]
        return float(r.sites[0, s.layer, s.position] - r.chosen[0, left].sum())


def split_edges(g: AttributionGraph, queries: list[int], nodes_at: dict,
                pass_for: Callable[[int], Pass], ends: list[int], batch: int, L: int,
                exact: _Exact | None = None
                ) -> tuple[tuple[GraphEdge, ...], GraphCheck, int]:
    """The kept edges, each split over the attention heads that carry it (heads.py): direct,
    the TOP_HEADS heads of largest |share| and the rest; and the check that every split sums
    to its edge (`graph_heads`). The rows of a target come from the frozen pass of the shortest
    prefix that holds it (its candidates' rows did), a logit's from the whole prompt's. With
    `exact` (precision float32: pass_for's passes are float32), each edge whose split misses
    it takes its weight from its target's row recomputed in float64 (`exact`) and is split
    again on the float64 passes; the rows so recomputed are counted (the third value)."""
    import numpy as np

    by_id = {n.node_id: n for n in g.nodes}
    source_of = {i: _source_of(by_id[i], nodes_at) for i in {e.source for e in g.edges}}
    E = len(g.edges)
    direct, parts, skip = _splits(g.edges, by_id, source_of, queries, pass_for, ends, batch, L)
    weight = np.array([e.weight for e in g.edges])
    rel = _split_misses(direct, parts, skip, weight)
    redone = 0
    if exact is not None and bool((rel > RTOL).any()):
        again = np.flatnonzero(rel > RTOL)
        missed = {g.edges[int(i)].target for i in again}
        targets = {i: _target_of(by_id[i], queries) for i in missed}
        got = exact.rows(list(targets.values()), batch)
        redone = len(got)
        for i in again.tolist():
            e = g.edges[i]
            weight[i] = exact.edge(got[targets[e.target]], source_of[e.source])
        d, p, sk = _splits(tuple(g.edges[i] for i in again.tolist()), by_id, source_of, queries,
                           exact.passes, ends, batch, L)
        direct[again], skip[again] = d, sk
        if parts is not None and p is not None:
            parts[again] = p
        rel = _split_misses(direct, parts, skip, weight)
    flat = (np.zeros((E, 0)) if parts is None else parts.reshape(E, -1))  # (E, L·nh)
    nh = 1 if parts is None else parts.shape[2]
    worst_i = int(np.argmax(rel)) if E else 0
    worst = float(rel[worst_i]) if E else 0.0
    where = f"{g.edges[worst_i].source} -> {g.edges[worst_i].target}" if E else ""
    k = min(TOP_HEADS, flat.shape[1])
    top = np.argsort(-np.abs(flat), axis=1, kind="stable")[:, :k]  # (E, k)
    top_vals = np.take_along_axis(flat, top, axis=1)  # (E, k)
    rest = flat.sum(1) - np.where(top_vals != 0.0, top_vals, 0.0).sum(1)
    edges = []
    skipping = bool(np.any(skip != 0.0))
    for edge, cs, vs, d, r, sk, w in zip(g.edges, top.tolist(), top_vals.tolist(),
                                         direct.tolist(), rest.tolist(), skip.tolist(),
                                         weight.tolist(), strict=True):
        heads = tuple(EdgeHead(layer=c // nh, head=c % nh, share=v)
                      for c, v in zip(cs, vs, strict=True) if v != 0.0)
        edges.append(replace(edge, weight=float(w), direct=d, heads=heads, heads_rest=r,
                             skip=sk if skipping else None))
    if redone:  # some weights are their float64 rows': the edges by |weight| again
        edges.sort(key=lambda e: -abs(e.weight))
    plus = " + skip" if skipping else ""
    check = GraphCheck(name="graph_heads", value=worst, ok=worst <= RTOL, worst=where,
                       tolerance=f"|direct + Σ heads' shares{plus} − edge| ≤ {RTOL:g}·max(|edge|, "
                                 "1e-6·Σ|shares|) for every kept edge (float64)")
    return tuple(edges), check, redone


def _splits(edges: Sequence[GraphEdge], by_id: dict[str, GraphNode],
            source_of: dict[str, Source], queries: list[int], pass_for: Callable[[int], Pass],
            ends: list[int], batch: int, L: int
            ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """The split of `edges` over heads (heads.split), batched by target and pass: direct (E,),
    the heads' parts (E, L, nh; None without edges) and the skip terms' (E,)."""
    import numpy as np

    total = max(queries) + 1
    by_pass: dict[int, dict[Target, list[int]]] = {}
    for e, edge in enumerate(edges):
        t = _target_of(by_id[edge.target], queries)
        end = _pass_end(t, ends, total)
        by_pass.setdefault(end, {}).setdefault(t, []).append(e)
    E = len(edges)
    direct, parts, skip = np.zeros(E), None, np.zeros(E)
    for end, per_target in sorted(by_pass.items()):
        p = pass_for(end)
        targets = list(per_target)
        vecs = vectors(p, {source_of[edges[e].source] for es in per_target.values()
                           for e in es})  # once for every batch of this pass
        for i in range(0, len(targets), batch):
            ts = targets[i:i + batch]
            pairs = [(b, e) for b, t in enumerate(ts) for e in per_target[t]]
            srcs = [(b, source_of[edges[e].source]) for b, e in pairs]
            got = split(p, ts, srcs, L, vecs)
            rows = np.array([e for _, e in pairs], dtype=int)
            if parts is None:
                parts = np.zeros((E, L, got.parts.shape[2]))
            direct[rows], parts[rows] = got.direct, got.parts
            skip[rows] = got.skip.sum(1)
        del vecs  # freed before the next pass's are made (S × L × d values: vectors_bytes)
    return direct, parts, skip


def _split_misses(direct: np.ndarray, parts: np.ndarray | None, skip: np.ndarray,
                  weight: np.ndarray) -> np.ndarray:
    """(E,) each edge's |direct + Σ heads' shares + skip − edge| / max(|edge|, 1e-6 · Σ|shares|):
    what graph_heads holds to RTOL."""
    import numpy as np

    E = len(weight)
    flat = np.zeros((E, 0)) if parts is None else parts.reshape(E, -1)
    err = np.abs(direct + flat.sum(1) + skip - weight)
    scale = np.maximum(np.maximum(np.abs(weight), 1e-6 * (np.abs(direct) + np.abs(skip)
                                                          + np.abs(flat).sum(1))), 1e-300)
    return err / scale


QK_TERMS = 6  # terms of a --qk score split shown (the rest summed)
QK_TRIES = 4  # head shares tried per --qk pick (those read at query 0 are skipped)


def head_scores(lm: LoadedModel, g: AttributionGraph, n: int, queries: list[int],
                ids: list[int], nodes_at: dict, pass_for: Callable[[int], Pass],
                ends: list[int]) -> tuple[tuple[GraphQK, ...], GraphCheck]:
    """--qk n: the n largest head shares of the kept edges (of the QK_TRIES · n largest, those
    whose largest read is not at query 0, which sees only itself: its weight is 1 whatever the
    score); for each, the query position whose read carries most of it (heads.by_query, whose
    sum over the queries is checked against the share) and its attention score there split
    (core/qk.py's split_score, its own checks against the model); and the check `graph_qk`
    over them."""
    import numpy as np

    from fptrace.commands.graph.heads import by_query
    from fptrace.core.qk import split_score

    by_id = {nd.node_id: nd for nd in g.nodes}
    shares = sorted(((e, h) for e in g.edges for h in e.heads
                     if by_id[e.target].position > 0),  # else read at query 0 only
                    key=lambda x: -abs(x[1].share))
    out: list[GraphQK] = []
    worst, where, ok = 0.0, "", True
    total = len(ids)
    for e, h in shares[:QK_TRIES * n]:
        if len(out) == n:
            break
        src, tgt = by_id[e.source], by_id[e.target]
        t = _target_of(tgt, queries)
        end = _pass_end(t, ends, total)
        terms = by_query(pass_for(end), t, _source_of(src, nodes_at), h.layer, h.head)
        rel = abs(float(terms.sum()) - h.share) / max(abs(h.share), 1e-300)
        if rel >= worst:
            worst, where = rel, f"L{h.layer}.H{h.head} ({e.source} -> {e.target})"
        q = int(np.argmax(np.abs(terms)))
        if q == 0:  # the first query sees only itself: its weight is 1 whatever the score
            continue
        s = split_score(lm, ids, h.layer, h.head, q, src.position, top=QK_TERMS)
        label = f"L{h.layer}.H{h.head} q{q} k{src.position} ({e.source} -> {e.target})"
        if not s.ok:
            ok, where = False, f"{label}: " + "; ".join(c.name for c in s.checks if not c.ok)
        out.append(GraphQK(source=e.source, target=e.target, layer=h.layer, head=h.head,
                           share=h.share, query=q, key=src.position,
                           query_share=float(terms[q]), pattern=_pattern(pass_for(end), h, q,
                                                                         src.position),
                           weight=s.weight, score=s.score, top=s.top, rest=s.rest,
                           checks=s.checks))
    check = GraphCheck(name="graph_qk", value=worst, ok=ok and worst <= RTOL, worst=where,
                       tolerance=f"|Σ over queries of a head's share − the share| ≤ {RTOL:g}·"
                                 "|share| (float64), and each score split's checks against the "
                                 "model (attribute --qk's) hold")
    return tuple(out), check


def _pattern(p: Pass, h: EdgeHead, q: int, k: int) -> float:
    """The frozen pattern's weight of query q on key k in head h (the pass's own)."""
    from fptrace.commands.graph.freezing import frozen_pattern

    return float(frozen_pattern(*p.patterns[h.layer])[0, h.head, q, k])


def _pass_end(t: Target, ends: list[int], whole: int) -> int:
    """The length of the prefix whose frozen pass gave target t's rows: the shortest that holds
    a neuron's (latent's) position (compute's prefixes), the whole prompt's for a logit."""
    return whole if t.layer is None else next(x for x in ends if x > t.position)


def _target_of(n: GraphNode, queries: list[int]) -> Target:
    """The Target whose rows a computed node's are (a logit: its query's index)."""
    if n.layer is None:
        return Target(None, queries.index(n.position), int(n.index or 0))
    return Target(n.layer, n.position, int(n.index or 0))


def _source_of(n: GraphNode, nodes_at: dict) -> Source:
    """The Source a node is (heads.py): a token, a neuron or latent, a remainder (its site's
    neurons but those that are nodes: `nodes_at`) or an error node."""
    if n.node_type == "embedding":
        return Source(None, n.position)
    if n.node_type == "error":
        return Source(n.layer, n.position, error=True)
    if n.index is None:
        return Source(n.layer, n.position, left_out=tuple(nodes_at.get((n.layer, n.position), ())))
    return Source(n.layer, n.position, n.index)


def _check_numbers(node_threshold: float, edge_threshold: float, max_nodes: int,
                   per_site: int, batch_size: int, verify: int = 0, qk: int = 0,
                   precision: str = "float64") -> None:
    """The API's numbers, refused naming its parameters (the command line checks its flags
    before loading: inputs.py)."""
    from fptrace.commands.graph.inputs import check_precision
    from fptrace.errors import BadInput
    from fptrace.numbers import check_finite

    for value, name in ((node_threshold, "node_threshold"), (edge_threshold, "edge_threshold")):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadInput(f"{name}={value!r}: give a number from 0 to 1")
        check_finite(float(value), name, low=0.0, high=1.0)
    for value, name in ((max_nodes, "max_nodes"), (per_site, "per_site"),
                        (batch_size, "batch_size")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadInput(f"{name}={value!r}: give a positive whole number")
    for value, name in ((verify, "verify"), (qk, "qk")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadInput(f"{name}={value!r}: give a whole number, 0 or more")
    check_precision(precision, verify, qk)


class _Layout:
    """Where each node sits in the candidate-level matrix: the candidates, then the per-site
    remainders (everything but the candidates), the per-site error nodes (with transcoders),
    tokens, logits."""

    def __init__(self, cand: Candidates, n_logits: int, errors: bool = False,
                 experts: dict[int, ExpertLayout] | None = None) -> None:
        self.cand, self.n_logits = cand, n_logits
        self.experts = experts or {}  # MoE block -> its neurons' numbering (experts.py)
        self.L, self.T = cand.L, cand.T
        self.n_cand = len(cand)
        self.n_err = self.L * self.T if errors else 0
        self.n = self.n_cand + self.L * self.T + self.n_err + self.T + n_logits

    def logit(self, j: int) -> int:
        return self.n_cand + self.L * self.T + self.n_err + self.T + j

    def row(self, r: Rows) -> np.ndarray:
        """One target's Rows as a row of the candidate-level matrix."""
        import numpy as np

        cand = r.chosen[0]  # (C,)
        err = r.errors[0].ravel() if self.n_err else np.zeros(0)
        rest = r.sites[0].ravel() - self.cand.per_site(cand)  # everything but the candidates
        return np.concatenate([cand, rest, err, r.tokens[0], np.zeros(self.n_logits)])


class _Matrix:
    """The computed nodes' rows of the candidate-level matrix, each laid out once as it comes,
    in a buffer of as many rows as can be computed (the logits and max_nodes candidates), and
    the node each row is of. A row's edges from the candidates are kept only here: each Rows
    in `done` holds a view of them."""

    def __init__(self, layout: _Layout, capacity: int) -> None:
        import numpy as np

        self.layout = layout
        self._rows = np.zeros((capacity, layout.n))  # pages untouched until written
        self._nodes = np.zeros(capacity, dtype=int)
        self.size = 0

    @property
    def rows(self) -> np.ndarray:
        return self._rows[:self.size]

    @property
    def nodes(self) -> np.ndarray:
        return self._nodes[:self.size]

    def keep(self, done: list, targets: list[Target], got: Rows, nodes: list[int]) -> None:
        """Append each target's rows to `done` (target, Rows, node) and to the matrix."""
        n_cand = self.layout.n_cand
        for b, (t, i) in enumerate(zip(targets, nodes, strict=True)):
            r = got.row(b)
            self._rows[self.size] = self.layout.row(r)
            self._nodes[self.size] = i
            done.append((t, replace(r, chosen=self._rows[self.size:self.size + 1, :n_cand]), i))
            self.size += 1


def _logit_nodes(real: Real, fixed: int | None, n_q: int) -> tuple[list[Target], np.ndarray]:
    """The logit nodes of each query position (the token `fixed`, or the top ones) and their
    probabilities."""
    import numpy as np
    import torch

    targets, probs = [], []
    for q in range(n_q):
        row = real.probs[q]
        if fixed is not None:
            idx, p = [fixed], [float(row[fixed])]
        else:
            top_p, top_i = torch.topk(row, min(MAX_LOGITS, row.shape[0]))
            cut = int(torch.searchsorted(torch.cumsum(top_p, 0), LOGIT_PROB)) + 1
            idx, p = top_i[:cut].tolist(), top_p[:cut].tolist()
        targets += [Target(None, q, int(i)) for i in idx]
        probs += p
    return targets, np.array(probs)


def _sums_check(done: list, value: Callable[[Target], float], lm: LoadedModel,
                layout: _Layout) -> GraphCheck:
    """Every computed node: Σ edges + bias terms = its value in the model."""
    import numpy as np

    worst, where = 0.0, ""
    for t, r, _ in done:
        rel = float(r.misses(np.array([value(t)]))[0])
        if rel >= worst:
            worst, where = rel, _label(lm, t, layout)
    return GraphCheck(name="graph_sums", value=worst, ok=worst <= RTOL, worst=where,
                      tolerance=f"|Σ edges + bias − value| ≤ {RTOL:g}·max(|value|, "
                                "1e-6·Σ|terms|) for every computed node (float64)")


def _model_check(real: Real, dtype: str) -> GraphCheck:
    """The float64 copy's logits equal the model's own, within the model dtype's tolerance."""
    diff = (real.logits - real.own).abs()
    scale = max(1.0, float(real.own.abs().max()))
    worst = float(diff.max()) / scale
    rtol = rtol_for(dtype)
    q, v = divmod(int(diff.argmax()), diff.shape[1])
    return GraphCheck(name="graph_model", value=worst, ok=worst <= rtol,
                      worst=f"logit of token #{v} at query {q}",
                      tolerance=f"max |float64 logit − the model's {dtype} logit| ≤ {rtol:g}·"
                                "max(1, max |logit|)")


def _label(lm: LoadedModel, t: Target, layout: _Layout) -> str:
    if t.layer is None:
        return f"logit {lm.token_text(t.index)!r} (query {t.position})"
    if layout.n_err:
        return f"L{t.layer} T{t.index} @{t.position}"
    return f"L{t.layer} {neuron_name(layout.experts, t.layer, t.index)} @{t.position}"


ERROR_NODES = ("one per (block, position): what the block's transcoder misses of its MLP's "
               "output there (the MLP's output minus the reconstruction), a constant under the "
               "freezing; a block without a transcoder: its whole MLP output")
NO_ERROR_NODES = ("none: under this freezing the model is exactly linear between neurons, so "
                  "every node's inputs are accounted for; what is not a node is summed in its "
                  "site's remainder")


def _assemble(lm: LoadedModel, prepared: Prepared, queries: list[int], ids: list[int],
              real: Real, done: list, matrix: _Matrix, visited: np.ndarray, weights: np.ndarray,
              checks: list[GraphCheck], node_threshold: float, edge_threshold: float,
              max_nodes: int, k: int, start: float,
              tset: TranscoderSet | None) -> tuple[AttributionGraph, list[GraphNode]]:
    """The graph over the computed neurons (or latents): their rows with the candidates not
    computed folded into their site's remainder; pruned, scored, described; and the computed
    neurons (latents) by influence, those the pruning dropped included."""
    layout = matrix.layout
    L, T = layout.L, layout.T
    import numpy as np

    from fptrace.commands.graph.notes import BLOCKS_WITHOUT_TRANSCODER, CLAMPED_NEURONS

    neurons = [int(c) for c in np.flatnonzero(visited)]
    nn_ = len(neurons)
    n_rest, n_err, n_log = L * T, layout.n_err, layout.n_logits
    n = nn_ + n_rest + n_err + T + n_log
    col = np.concatenate([np.array(neurons, dtype=int),
                          np.arange(layout.n_cand, layout.n)]).astype(int)
    # the computed nodes' rows: the only nonzero rows of A; where every candidate was computed
    # their columns are the matrix's own (col is every column in order), so the matrix's rows
    # are A's rows, the remainders' columns only added to (by zeros) in place: one copy of the
    # rows fewer (hundreds of MB in a big graph), the same numbers
    every = nn_ == layout.n_cand
    R = matrix.rows if every else np.zeros((len(done), n))
    index = np.zeros(len(done), dtype=int)
    bias: dict[int, float] = {}
    cand_index = {c: i for i, c in enumerate(neurons)}
    for j, (_, _, node) in enumerate(done):
        full = matrix.rows[j]
        row = full if every else full[col]
        # the candidates not computed join their site's remainder
        cand = full[:layout.n_cand].copy()
        cand[neurons] = 0
        row[nn_:nn_ + n_rest] += layout.cand.per_site(cand)
        i = cand_index[node] if node < layout.n_cand else nn_ + (node - layout.n_cand)
        R[j], index[j] = row, i
        bias[i] = float(done[j][1].bias[0])
    A = Adjacency(R, index, n)
    w = np.zeros(n)
    w[-n_log:] = weights[-n_log:]
    tokens = np.zeros(n, dtype=bool)
    tokens[nn_ + n_rest + n_err:nn_ + n_rest + n_err + T] = True
    errors = np.zeros(n, dtype=bool)
    errors[nn_ + n_rest:nn_ + n_rest + n_err] = True
    rest = errors.copy()
    rest[nn_:nn_ + n_rest] = True
    # Â, the influence on the weighted logits and each logit's alone: made once for both
    # scores, the pruning and the logit effects (each a pass over the rows: seconds in a big
    # graph), Â freed before the pruning makes its own copies
    An = A.normalized()
    inf = spread(An.rows, w, A.index)
    repl, compl = scores(An, inf, w, errors, tokens)
    repl_n, compl_n = scores(An, inf, w, rest, tokens)
    by_influence = np.argsort(-inf, kind="stable")
    logits = [int(i) for i in by_influence if i >= n - n_log]  # every logit is kept
    one_hot = np.zeros((len(logits), n))
    one_hot[np.arange(len(logits)), logits] = 1.0
    alone = spread(An.rows, one_hot, A.index)  # (logits, n): each logit's influence alone
    del An
    pr = prune(A, w, nn_, n_rest + n_err, node_threshold, edge_threshold, inf=inf)
    nodes = []
    ids_of: list[str] = []
    logit_targets = [t for t, _, node in done if node >= layout.n_cand]
    for i in range(n):
        nodes.append(_node(lm, i, neurons, layout, ids, queries, real, logit_targets,
                           pr, bias.get(i), w))
        ids_of.append(nodes[-1].node_id)
    kept = [i for i in by_influence if pr.nodes[i]]
    for i, effects in _logit_effects(A, alone, logits, kept, ids_of).items():
        nodes[i] = replace(nodes[i], logits=effects)
    rows, src = np.nonzero(pr.edges)
    edges = sorted((GraphEdge(source=ids_of[s], target=ids_of[int(index[r])],
                              weight=float(R[r, s]))
                    for r, s in zip(rows, src, strict=True)), key=lambda e: -abs(e.weight))
    layer_of = [-1 if nd.node_type == "embedding" else L if nd.layer is None else nd.layer
                for nd in nodes]  # tokens first, logits past the last block
    paths = strongest_paths(A, pr.edges, pr.nodes, w, ids_of, layer_of=layer_of)
    notes = base_notes(lm)
    if tset is not None and tset.missing:
        notes.append(BLOCKS_WITHOUT_TRANSCODER(k=len(tset.missing), blocks=_ranges(tset.missing),
                                               n=L))
    if real.clamped is not None and bool(real.clamped.any()):
        blocks = tuple(int(b) for b in real.clamped.flatten(1).any(1).nonzero().flatten())
        limit = next(lay.limit for lay in layout.experts.values() if lay.limit is not None)
        notes.append(CLAMPED_NEURONS(k=int(real.clamped.sum()), blocks=_ranges(blocks),
                                     limit=limit))
    info = model_info(lm)
    ranked = [nodes[i] for i in by_influence if i < nn_]
    freezing = freezing_lines(lm.parts.family, tset is not None, layout.experts, L,
                              tset is not None and bool(tset.skips))
    routes = graph_routes(real.routes, {(nodes[i].layer, nodes[i].position) for i in kept
                                        if nodes[i].node_type in ("neuron", "other neurons")})
    return AttributionGraph(
        prompt=prepared.text, model=info, tokens=lm.tokens(prepared)[:len(ids)],
        queries=tuple(queries), freezing=freezing, routes=routes,
        edge=EDGE_MEANING if tset is None else TRANSCODER_EDGE,
        error_nodes=NO_ERROR_NODES if tset is None else ERROR_NODES,
        transcoders=None if tset is None else tset.path,
        missing_blocks=() if tset is None else tset.missing,
        node_threshold=node_threshold, edge_threshold=edge_threshold, max_nodes=max_nodes,
        per_site=k, candidates=layout.n_cand, computed=nn_,
        scores=GraphScores(replacement=repl, completeness=compl, replacement_nodes=repl_n,
                           completeness_nodes=compl_n),
        nodes=tuple(nodes[i] for i in kept), edges=tuple(edges), paths=tuple(paths),
        checks=tuple(checks), ok=all(c.ok for c in checks), notes=tuple(notes),
        seconds=time.perf_counter() - start), ranked


def _logit_effects(A: Adjacency, alone: np.ndarray, logits: list[int], kept: list[int],
                   ids_of: list[str]) -> dict[int, tuple[GraphLogitEffect, ...]]:
    """Each kept node but a logit: its direct edge into each logit node (`logits`, in their
    order by influence) and its influence on that logit alone (alone[c]: logits[c]'s)."""
    row_of = {int(node): r for r, node in enumerate(A.index)}
    first_logit = min(logits)
    return {i: tuple(GraphLogitEffect(logit=ids_of[lg], edge=float(A.rows[row_of[lg], i]),
                                      influence=float(alone[c, i]))
                     for c, lg in enumerate(logits))
            for i in kept if i < first_logit}


def _ranges(blocks: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> '0-2, 5'."""
    out: list[str] = []
    for b in blocks:
        if out and out[-1].split("-")[-1] == str(b - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{b}"
        else:
            out.append(str(b))
    return ", ".join(out)


def _node(lm: LoadedModel, i: int, neurons: list[int], layout: _Layout, ids: list[int],
          queries: list[int], real: Real, logits: list[Target], pr: Pruned, bias: float | None,
          w: np.ndarray) -> GraphNode:
    L, T = layout.L, layout.T
    nn_ = len(neurons)
    common: dict[str, Any] = {"influence": float(pr.influence[i]),
                              "cumulative": float(pr.cumulative[i]), "bias": bias}
    latents = bool(layout.n_err)
    if i < nn_:
        t = layout.cand.target(neurons[i])
        assert t.layer is not None
        expert, shared, neuron = neuron_fields(layout.experts, t.layer, t.index)
        return GraphNode(node_id=f"{t.layer}_{t.index}_{t.position}",
                         node_type="latent" if latents else "neuron",
                         layer=t.layer, position=t.position, index=t.index,
                         label=_label(lm, t, layout),
                         value=float(real.acts[t.layer, t.position, t.index]),
                         activations=tuple(real.acts[t.layer, :, t.index].tolist()), **common,
                         expert=expert, shared_expert=shared, neuron=neuron)
    i -= nn_
    if i < L * T:
        layer, pos = divmod(i, T)
        return GraphNode(node_id=f"R_{layer}_{pos}",
                         node_type="other latents" if latents else "other neurons",
                         layer=layer, position=pos, index=None, label=f"L{layer} rest @{pos}",
                         value=None, **common)
    i -= L * T
    if i < layout.n_err:
        layer, pos = divmod(i, T)
        return GraphNode(node_id=f"X_{layer}_{pos}", node_type="error", layer=layer,
                         position=pos, index=None, label=f"L{layer} error @{pos}", value=None,
                         **common)
    i -= layout.n_err
    if i < T:
        return GraphNode(node_id=f"E_{ids[i]}_{i}", node_type="embedding", layer=None, position=i,
                         index=ids[i], label=f"{lm.token_text(ids[i])!r} @{i}", value=None,
                         **common)
    t = logits[i - T]
    pos = queries[t.position]
    return GraphNode(node_id=f"{L + 1}_{t.index}_{pos}", node_type="logit", layer=None,
                     position=pos, index=t.index, label=f"{lm.token_text(t.index)!r}",
                     value=float(real.logits[t.position, t.index]),
                     prob=float(real.probs[t.position, t.index]), **common)


__all__ = ["RTOL", "TOP_HEADS", "backward_bytes", "graph", "graph_bytes", "pass_bytes",
           "prefix_ends", "query_positions", "rows_fitting", "split_edges", "vectors_bytes"]
