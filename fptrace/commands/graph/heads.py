"""Heads on edges: each kept edge split over the attention heads that carry it, exactly.

Under the freezing a source at (block ls, position s) writes one vector w into the stream at s
(a neuron or latent: its activation times what the stream receives from its block's MLP per
unit of it; a remainder or an error node alike; a token: its embedding as block 0 receives
it). From there the MLPs are cut (an edge is a direct effect: a gradient stops at every
neuron) and q and k are held (the patterns are frozen), so w stays in the stream at s,
unchanged, until either the target reads it there or a head of a later block reads it through
its values. The gradient of the target with respect to the stream at s is then the sum of one
gradient per reader, and the edge the sum of one part per reader:

    edge = direct + Σ over blocks l > ls, heads h of part(l, h)
    direct     = ⟨∂ target / ∂ (the stream the target reads)[s], w⟩   (0 unless the target is at s)
    part(l, h) = ⟨∂ target / ∂ v_l[h, s], J_l,s · w⟩

v_l[h] the values head h of block l multiplies by its frozen pattern (grouped-query attention:
its K/V head's, repeated, so the split is by query head) and J_l,s the map from the stream
entering block l at s to them (the frozen norm, W_V, any value norm: linear; their biases are
constants, bias terms, not part of an edge). part(l, h) is the part of the edge whose first
attention hop is head h of block l reading position s; what follows that hop (other heads, at
other positions) is inside its gradient, Σ over q of pattern[q, s] times the gradient at head
h's output at q.

The parts are computed apart from the edge: the gradients with respect to each block's values
and the target's read in one more backward pass of each target with kept edges; w and J_l,s·w
as Jacobian-vector products of the frozen pass's own modules (double backward); so that their
sum against the edge is a check on every run (`graph_heads`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fptrace.commands.graph.freezing import Pass
from fptrace.commands.graph.rows import Target, columns_of, seeds

if TYPE_CHECKING:
    import numpy as np
    import torch

SOURCES = 64  # sources per batched Jacobian-vector product


@dataclass(frozen=True)
class Source:
    """A node whose outgoing edges are split: a token (layer None), a neuron or latent (index),
    a remainder (index None: the site's neurons but `left_out`) or an error node."""

    layer: int | None
    position: int
    index: int | None = None
    error: bool = False
    # a remainder: the neurons of its site that are nodes (its site says which: not compared)
    left_out: tuple[int, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Splits:
    """Edges split: per edge the part no head carries, and each (block, head)'s part."""

    direct: np.ndarray  # (E,)
    parts: np.ndarray  # (E, L, nh): block l's head h's part (0 for blocks before the source's)
    skip: np.ndarray  # (E, L): block l's skip term's part (0 without a skip, or before the source)


def _jvp(out: torch.Tensor, inp: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """J · V[i] for each row of V (n, *inp.shape), J the map inp -> out of the frozen pass
    (linear under the freezing): (n, *out.shape), by double backward (J is applied as the
    transpose of the transpose)."""
    import torch

    u = torch.zeros_like(out, requires_grad=True)
    (jt,) = torch.autograd.grad(out, inp, u, create_graph=True, allow_unused=True)
    if jt is None or not jt.requires_grad:  # out does not depend on inp
        return torch.zeros((V.shape[0], *out.shape), dtype=out.dtype, device=out.device)
    (jv,) = torch.autograd.grad(jt, u, V, is_grads_batched=True, allow_unused=True)
    if jv is None:
        return torch.zeros((V.shape[0], *out.shape), dtype=out.dtype, device=out.device)
    return jv


def written(p: Pass, sources: list[Source]) -> torch.Tensor:
    """(n, d): the vector each source writes into the stream at its position (its block's map
    from its leaf to the stream is position by position, so sources at different positions share
    a row of the Jacobian-vector product: _rows)."""
    import torch

    d = p.blocks_in[0].shape[-1]
    out = torch.zeros((len(sources), d), dtype=p.embed.dtype, device=p.embed.device)
    groups: dict[tuple[int | None, bool], list[int]] = {}
    for i, s in enumerate(sources):
        groups.setdefault((s.layer, s.error), []).append(i)
    for (layer, error), members in groups.items():
        if layer is None:
            inp, dst = p.embed, p.blocks_in[0]
        else:
            inp = p.errors[layer] if error else p.leaves[layer]
            dst = p.mlp_out[layer]
        for chunk, rows in _rows([sources[i].position for i in members]):
            V = torch.zeros((int(rows.max()) + 1, *inp.shape), dtype=inp.dtype, device=inp.device)
            for k, r in zip(chunk, rows.tolist(), strict=True):
                s = sources[members[k]]
                if layer is None or error:
                    V[r, 0, s.position] = inp[0, s.position].detach()
                elif s.index is not None:
                    col, there = columns_of(p, layer, torch.tensor([s.index]))
                    if bool(there[0]):
                        c = int(col[0])
                        V[r, 0, s.position, c] = inp[0, s.position, c].detach()
                else:  # a remainder: every neuron of its site but the graph's
                    V[r, 0, s.position] = inp[0, s.position].detach()
                    if s.left_out:
                        col, there = columns_of(p, layer, torch.tensor(s.left_out))
                        V[r, 0, s.position, col[there.to(col.device)]] = 0.0
            jv = _jvp(dst, inp, V)  # (rows, 1, T, d)
            pos = torch.tensor([sources[members[k]].position for k in chunk], device=jv.device)
            out[[members[k] for k in chunk]] = jv[rows.to(jv.device), 0, pos]
    return out


def _rows(positions: list[int]) -> list[tuple[list[int], torch.Tensor]]:
    """Items at these positions packed into the rows of batched Jacobian-vector products of a
    map that works position by position (the frozen norms, W_V, the down projections): at most
    one item a position in a row, so that a row's result at an item's position is that item's
    alone; a prompt's sources then take as many rows as its most crowded position has sources
    (not one each: each row costs the whole prompt's length). Returns, for each product of at
    most SOURCES rows, its items (indices into positions) and each one's row in it. A map that
    mixed positions would mix the items of a row: the split's check (`graph_heads`) would
    fail."""
    import torch

    seen: dict[int, int] = {}
    rank = []
    for q in positions:
        rank.append(seen.get(q, 0))
        seen[q] = rank[-1] + 1
    out = []
    for start in range(0, max(rank, default=-1) + 1, SOURCES):
        items = [i for i, r in enumerate(rank) if start <= r < start + SOURCES]
        out.append((items, torch.tensor([rank[i] - start for i in items], dtype=torch.long)))
    return out


def through_values(p: Pass, sources: list[Source], w: torch.Tensor
                   ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """block l -> (J_l,s · w of each source before block l, (n_l + 1, nh, hd), then a row of
    zeros; each source's row there, (n,): the zeros' for a source at or after block l): what
    its vector adds to each head's values of block l at its position. Only the sources before
    a block have a row of it: about half the rows of every source at every block, which is
    S × L × d float64 values (0.7 GB for 5,000 sources on the bundled model)."""
    return {layer: _before(p.values[layer], p.blocks_in[layer], sources, w, layer, 1)
            for layer in sorted(p.values)}  # values (1, nh, T, hd) of block inputs (1, T, d)


def through_skips(p: Pass, sources: list[Source], w: torch.Tensor
                  ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """block l (a skip transcoder's) -> (K_l,s · w of each source before block l, (n_l + 1,
    d), then a row of zeros; each source's row there, (n,)): what its vector adds to block l's
    skip term at its position (through_values' layout)."""
    return {layer: _before(p.skips[layer], p.reads[layer], sources, w, layer, 0)
            for layer in sorted(p.skips)}  # skip terms (1, T, d) of the MLP's inputs (1, T, d)


def _before(out: torch.Tensor, x: torch.Tensor, sources: list[Source], w: torch.Tensor,
            layer: int, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(what each source before block `layer` adds to `out` (1, ...) at its own position
    (axis `axis` of out[0]) through x (1, T, d), its vector w there: (n_l + 1, ...), then a row
    of zeros; each source's row there, (n,)): through_values' and through_skips' layout."""
    import torch

    n = len(sources)
    before = [i for i, s in enumerate(sources) if s.layer is None or s.layer < layer]
    shape = out.shape[1:axis + 1] + out.shape[axis + 2:]
    res = torch.zeros((len(before) + 1, *shape), dtype=w.dtype, device=w.device)
    row = torch.full((n,), len(before), dtype=torch.long, device=w.device)
    row[before] = torch.arange(len(before), device=w.device)
    for items, rows in _rows([sources[i].position for i in before]):
        pos = torch.tensor([sources[before[k]].position for k in items], device=w.device)
        V = torch.zeros((int(rows.max()) + 1, *x.shape), dtype=x.dtype, device=x.device)
        rows = rows.to(w.device)
        V[rows, 0, pos] = w[[before[k] for k in items]]
        jv = _jvp(out, x, V)[:, 0].movedim(axis + 1, 1)  # (rows, T, ...)
        res[items] = jv[rows.to(jv.device), pos.to(jv.device)]
    return res, row


def _reads(p: Pass, t: Target) -> torch.Tensor:
    """The stream the target reads: its block's MLP input stream, or the final norm's."""
    if t.layer is not None:
        return p.reads[t.layer]
    assert p.final_in is not None  # a frozen pass that reached the final norm
    return p.final_in


def gradients(p: Pass, targets: list[Target]
              ) -> tuple[dict[int, torch.Tensor], torch.Tensor, dict[int, torch.Tensor]]:
    """For each target (a batch): the gradient with respect to each block's values, block l ->
    (n, nh, T, hd), with respect to the stream it reads (n, T, d), and with respect to each
    skip transcoder's skip term, block l -> (n, T, d)."""
    import torch

    outputs, grads = seeds(p, targets)
    top = max((t.layer for t in targets if t.layer is not None), default=None)
    any_logit = any(t.layer is None for t in targets)
    layers = [l for l in sorted(p.values) if any_logit or top is None or l <= top]
    skips = [l for l in sorted(p.skips) if any_logit or top is None or l < top]
    reads: list[torch.Tensor] = []
    for t in targets:
        r = _reads(p, t)
        if not any(r is x for x in reads):
            reads.append(r)
    got = torch.autograd.grad(outputs, [p.values[l] for l in layers] + reads +
                              [p.skips[l] for l in skips], grads,
                              retain_graph=True, allow_unused=True, is_grads_batched=True)
    n = len(targets)
    by_layer = {}
    for layer, g in zip(layers, got[:len(layers)], strict=True):
        v = p.values[layer]
        by_layer[layer] = (torch.zeros((n, *v.shape[1:]), dtype=v.dtype, device=v.device)
                           if g is None else g[:, 0])
    direct = torch.zeros((n, *p.blocks_in[0].shape[1:]), dtype=p.embed.dtype,
                         device=p.embed.device)
    for b, t in enumerate(targets):
        r = _reads(p, t)
        k = next(i for i, x in enumerate(reads) if x is r)
        g = got[len(layers) + k]
        if g is not None:
            direct[b] = g[b, 0]
    by_skip = {}
    for layer, g in zip(skips, got[len(layers) + len(reads):], strict=True):
        s = p.skips[layer]
        by_skip[layer] = (torch.zeros((n, *s.shape[1:]), dtype=s.dtype, device=s.device)
                          if g is None else g[:, 0])
    return by_layer, direct, by_skip


EDGES = 4096  # edges whose parts are gathered at once


@dataclass(frozen=True)
class Vectors:
    """What sources write, in one pass: each source's row, its vector w (S, d) in the stream,
    and per block l what w adds to each head's values there and each source's row of it
    (through_values: the sources before block l only, then zeros); per skip transcoder's block,
    what w adds to its skip term (through_skips)."""

    at: dict[Source, int]
    w: torch.Tensor
    u: dict[int, tuple[torch.Tensor, torch.Tensor]]
    k: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def vectors(p: Pass, sources: set[Source] | list[Source]) -> Vectors:
    """The Vectors of these sources in the pass p (each at a position p holds)."""
    ordered = sorted(set(sources), key=lambda s: (-1 if s.layer is None else s.layer,
                                                  s.position, -1 if s.index is None else s.index,
                                                  s.error))
    w = written(p, ordered)  # (S, d)
    return Vectors(at={s: i for i, s in enumerate(ordered)}, w=w,
                   u=through_values(p, ordered, w), k=through_skips(p, ordered, w))


def split(p: Pass, targets: list[Target], edges: list[tuple[int, Source]], L: int,
          vecs: Vectors | None = None) -> Splits:
    """The edges (each the index of its target in `targets`, and its source) split, from the
    pass p (holding every target's and source's position); vecs: the sources' Vectors in p
    (computed here when not given)."""
    import numpy as np
    import torch

    vecs = vectors(p, {s for _, s in edges}) if vecs is None else vecs
    at, w, u = vecs.at, vecs.w, vecs.u
    g, direct, gs = gradients(p, targets)  # l -> (n, nh, T, hd); (n, T, d); l -> (n, T, d)
    nh = next(iter(p.values.values())).shape[1]
    device = w.device
    b_all = torch.tensor([b for b, _ in edges], device=device, dtype=torch.long)
    s_all = torch.tensor([at[s] for _, s in edges], device=device, dtype=torch.long)
    pos_all = torch.tensor([s.position for _, s in edges], device=device, dtype=torch.long)
    src_all = torch.tensor([-1 if s.layer is None else s.layer for _, s in edges],
                           device=device, dtype=torch.long)
    E = len(edges)
    parts = np.zeros((E, L, nh))
    skip = np.zeros((E, L))
    out_direct = np.zeros(E)
    for start in range(0, E, EDGES):
        sl = slice(start, start + EDGES)
        b, i, pos, src = b_all[sl], s_all[sl], pos_all[sl], src_all[sl]
        out_direct[sl] = (direct[b, pos] * w[i]).sum(-1).cpu().numpy()
        for layer, gl in g.items():
            ul, row = u[layer]
            share = (gl[b, :, pos] * ul[row[i]]).sum(-1)  # (e, nh)
            share = share * (src < layer)[:, None]  # a head reads what was written before it
            parts[sl, layer] = share.cpu().numpy()
        for layer, gl in gs.items():
            kl, row = vecs.k[layer]
            part = (gl[b, pos] * kl[row[i]]).sum(-1)  # (e,)
            skip[sl, layer] = (part * (src < layer)).cpu().numpy()  # read after it was written
    return Splits(direct=out_direct, parts=parts, skip=skip)


def by_query(p: Pass, target: Target, source: Source, layer: int, head: int) -> np.ndarray:
    """(T,) head `head` of block `layer`'s share of the edge source -> target, by the query
    position whose read carries it: pattern[q, s] · ⟨∂ target / ∂ (the head's output at q),
    J_l,s · w⟩ (0 for q < s). They sum to the share (the gradient at the values is Σ over q of
    pattern[q, s] times the gradient at the output at q)."""
    import torch

    from fptrace.commands.graph.freezing import frozen_pattern

    ul, row = vectors(p, [source]).u[layer]
    u = ul[row[0], head]  # (hd,)
    outputs, grads = seeds(p, [target])
    (gz,) = torch.autograd.grad(outputs, [p.heads_out[layer]], grads, retain_graph=True,
                                allow_unused=True, is_grads_batched=True)
    T = p.heads_out[layer].shape[2]
    if gz is None:
        return torch.zeros(T, dtype=torch.float64).numpy()
    pattern = frozen_pattern(*p.patterns[layer])  # (1, nh, T, T), the held pattern, recomputed
    gq = gz[0, 0, head]  # (T, hd): the gradient at the head's output at each query
    return (pattern[0, head, :, source.position] * (gq @ u)).detach().cpu().numpy()


__all__ = ["Source", "Splits", "Vectors", "by_query", "split", "through_skips", "through_values",
           "written"]
