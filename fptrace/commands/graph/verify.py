"""`fptrace graph --verify N`: the N most influential computed nodes (neurons or latents, kept by
the pruning or not) removed one at a time, in forward passes of the float64 copy: the edges
checked by the intervention they predict.

1. Frozen, every other node held (freezing.Replay with hold): attention patterns, norm scales
   and gates at the prompt's values, and every other neuron's (latent's) activation entering the
   down projection (the decoder) held at its value, the removed one set to 0. The model is then
   linear and no other node responds, so every computed node (a neuron, latent or logit whose
   incoming edges the graph holds) changes by exactly minus its edge from the removed node;
   checked for each of them (`graph_verify`, float64, the graph_sums rule).
2. Frozen, the other nodes following (Replay without hold): the removed node's effect on the top
   logit through every path of the linear model: what the graph predicts.
3. Unfrozen: the node's activation set to 0 in the float64 model as it computes (its patterns,
   norms and gates free, a mixture's routing too; a latent's decoded vector taken from its MLP's
   output): the real change
   of the top logit, beside the prediction. A number, not a verdict: the difference is what the
   freezing leaves out.

Each step is one batched pass: row 0 the prompt as it is, one row per removed node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fptrace.commands.graph.experts import layouts, removal_hooks
from fptrace.commands.graph.freezing import MlpSites, Replay, frozen
from fptrace.commands.graph.result import GraphCheck, GraphVerified
from fptrace.commands.graph.rows import Candidates, Rows, Target
from fptrace.core.hooks import Hook, hooked

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch import nn

    from fptrace.commands.graph.freezing import Pass
    from fptrace.commands.graph.transcoders import TranscoderSet
    from fptrace.families.parts import ModelParts

ROWS = 16  # removed nodes per pass (with the prompt's own row)


def _edge(r: Rows, s: Target, cand: Candidates) -> float:
    """The edge from candidate s into the target whose rows r are."""
    return float(r.chosen[0][cand.columns[s]])


def _values(p: Pass, done: list, B: int) -> torch.Tensor:
    """(B, targets): each computed target's value in each row of a replay."""
    import torch

    cols = []
    for t, _, _ in done:
        src = p.logits if t.layer is None else p.acts[t.layer]
        cols.append(src[:B, t.position, t.index])
    return torch.stack(cols, dim=1)


def _real_logits(model: nn.Module, parts: ModelParts, sites: MlpSites | None, tset: Any,
                 x: torch.Tensor, keep: torch.Tensor, picks: list[Target], acts: torch.Tensor
                 ) -> torch.Tensor:
    """(B, Q, V) the float64 model's logits as it computes, row b + 1 without picks[b]."""
    import torch

    def zero(layer: int) -> Callable[..., tuple]:
        def hook(module: nn.Module, args: tuple) -> tuple:
            a = args[0].clone()
            for b, s in enumerate(picks, 1):
                if s.layer == layer:
                    a[b, s.position, s.index] = 0.0
            return (a, *args[1:])
        return hook

    def minus(layer: int) -> Callable[..., object]:
        W = tset.by_block[layer].W_dec  # (n, d)

        def hook(module: nn.Module, args: tuple, output: torch.Tensor | tuple) -> object:
            y = (output[0] if isinstance(output, tuple) else output).clone()
            for b, s in enumerate(picks, 1):
                if s.layer == layer:
                    y[b, s.position] -= acts[s.layer, s.position, s.index] * W[s.index]
            return (y, *output[1:]) if isinstance(output, tuple) else y
        return hook

    layers = sorted({s.layer for s in picks if s.layer is not None})
    if tset is None:
        assert sites is not None
        experts = layouts(parts, sites.moe)
        hooks = [Hook.before(parts.blocks[l].get_submodule(sites.down), zero(l)) for l in layers
                 if l not in experts]
        for l in layers:
            if l in experts:
                assert sites.moe is not None
                hooks += removal_hooks(parts.mlps[l], l, sites.moe, experts[l],
                                       [(b, s.position, s.index)
                                        for b, s in enumerate(picks, 1) if s.layer == l])
    else:
        hooks = [Hook.after(parts.mlps[l], minus(l)) for l in layers]
    with torch.no_grad(), hooked(hooks, prepend=True):
        return model(x, use_cache=False, logits_to_keep=keep).logits


def verify(model: nn.Module, parts: ModelParts, sites: MlpSites | None, tset: TranscoderSet | None,
           ids: list[int], queries: list[int], done: list, cand: Candidates, picks: list[Target],
           labels: list[str], logit: Target, acts: torch.Tensor, rtol: float
           ) -> tuple[tuple[GraphVerified, ...], GraphCheck]:
    """The three interventions of the module's text for each node of `picks` (candidates whose
    edges into the computed nodes `done` the graph holds; labels their names); logit: the top
    logit node; acts (L, T, m) the nodes' values. Returns each node's figures and the check."""
    import torch

    device = parts.embed.weight.device
    keep = torch.tensor(queries, device=device)
    out: list[GraphVerified] = []
    worst, where = 0.0, ""
    top = next(j for j, (t, _, _) in enumerate(done) if t == logit)
    for start in range(0, len(picks), ROWS - 1):
        chunk = picks[start:start + ROWS - 1]
        B = len(chunk) + 1
        x = torch.tensor([ids] * B, device=device)
        removed = (None, *((s.layer, s.position, s.index) for s in chunk if s.layer is not None))
        assert len(removed) == B  # neurons and latents: each of a block
        got = {}
        for hold in (True, False):
            with torch.no_grad(), frozen(model, parts, sites, tset,
                                         replay=Replay(removed, hold)) as p:
                model(x, use_cache=False, logits_to_keep=keep)
                got[hold] = _values(p, done, B).cpu()  # (B, targets)
        real = _real_logits(model, parts, sites, tset, x, keep, chunk, acts)
        real_top = real[:, logit.position, logit.index].cpu()
        for b, s in enumerate(chunk, 1):
            rel_s, targets, largest = 0.0, 0, 0.0
            for j, (_, r, _) in enumerate(done):
                e = _edge(r, s, cand)
                change = float(got[True][b, j] - got[True][0, j])
                scale = max(abs(e), 1e-6 * r.terms, 1e-300)
                rel = abs(change + e) / scale
                targets += e != 0.0
                largest = max(largest, abs(e))
                if rel >= rel_s:
                    rel_s = rel
            if rel_s >= worst:
                worst, where = rel_s, labels[start + b - 1]
            out.append(GraphVerified(
                node=labels[start + b - 1], targets=targets, largest_edge=largest,
                difference=rel_s, direct=-_edge(done[top][1], s, cand),
                held=float(got[True][b, top] - got[True][0, top]),
                predicted=float(got[False][b, top] - got[False][0, top]),
                real=float(real_top[b] - real_top[0])))
    check = GraphCheck(name="graph_verify", value=worst, ok=worst <= rtol, worst=where,
                       tolerance=f"|change when the node is removed + edge| ≤ {rtol:g}·max(|edge|, "
                                 "1e-6·Σ|terms|) for each computed node, every other node held "
                                 "(float64)")
    return tuple(out), check


__all__ = ["verify"]
