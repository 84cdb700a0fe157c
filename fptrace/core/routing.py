"""The routing engine: which experts each MoE block chose for every position, captured by a
hook on each block's router in the same forward pass, and checked against the family's routing
rule recomputed from the router's own logits.

Every router of the MoE families returns (logits (N, E), weights of the chosen (N, k), indices
of the chosen (N, k)) for the N = B·T positions of the batch, row-major; that output is what
the hook keeps (float32 copies of the logits and weights). `route()`, the family's rule in
one function (softmax then top k, renormalised or not; softmax over the top-k logits; sigmoid
scores with a choice-only bias and grouped top-k, times a scale) lives in families/ops.py,
beside the expert mix explain recomputes with it; the check here runs it on every trace.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fptrace.core.hooks import Hook, hooked
from fptrace.families import Moe
from fptrace.families.kinds import Scoring
from fptrace.families.ops import route, route_distribution
from fptrace.families.parts import ModelParts
from fptrace.results import BlockRoute, Routing

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn
    from transformers import PretrainedConfig


def moe_facts(parts: ModelParts, config: PretrainedConfig) -> Moe | None:
    """The config's MoE facts, or None for a dense model (or a family without them)."""
    fam = parts.family
    return fam.moe(config) if fam.moe is not None else None


def routers(parts: ModelParts) -> list[tuple[int, nn.Module]]:
    """(block index, router module) of every MoE block: those whose MLP has the family's
    router (DeepSeek-V3's first blocks are dense and have none)."""
    out = []
    for i, mlp in enumerate(parts.mlps):
        try:
            out.append((i, mlp.get_submodule(parts.family.router)))
        except AttributeError:
            continue
    return out


def score_bias(parts: ModelParts, router: nn.Module) -> torch.Tensor | None:
    """The router's choice-only bias (DeepSeek-V3's e_score_correction_bias), or None."""
    name = parts.family.router_score_bias
    return None if name is None else getattr(router, name)


@dataclass
class RouterCapture:
    """What the router hooks kept in one forward pass: per MoE block, float32 logits (N, E),
    the weights (N, k) and the indices (N, k) the router returned."""

    blocks: list[int] = field(default_factory=list)
    logits: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    indices: dict = field(default_factory=dict)
    biases: dict = field(default_factory=dict)


@contextlib.contextmanager
def capture_routing(parts: ModelParts, config: PretrainedConfig) -> Iterator[RouterCapture | None]:
    """Hook every MoE block's router for one forward pass (None for a dense model: no hook).
    The router's outputs are kept as they are (float32 logits and weights are not copied: the
    MoE block only reads them)."""
    if moe_facts(parts, config) is None:
        yield None
        return
    cap = RouterCapture()
    found = routers(parts)
    cap.blocks = [i for i, _ in found]

    def hook(i: int):
        def keep(module: nn.Module, args: tuple, output: tuple) -> None:
            logits, weights, indices = output[0], output[1], output[2]
            cap.logits[i] = logits.detach().float()  # a copy only where the dtype differs
            cap.weights[i] = weights.detach().float()
            cap.indices[i] = indices.detach()
        return keep

    for i, router in found:
        bias = score_bias(parts, router)
        if bias is not None:
            cap.biases[i] = bias.detach().float()
    hooks: list[Hook] = [Hook.after(router, hook(i)) for i, router in found]
    with hooked(hooks):
        yield cap


def _by_expert(idx: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both sorted by expert id, to compare two choices whatever their order."""
    order = idx.argsort(dim=-1)
    return idx.gather(-1, order), w.gather(-1, order)


def weight_tolerance(dtype: str) -> float:
    """How far a recomputed weight may differ from the router's (its dtype's rounding)."""
    return 1e-5 if dtype == "float32" else 2e-2


def _stacked(cap: RouterCapture) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The blocks' logits (nb, N, E), weights and indices (nb, N, k), stacked: the work after
    the forward is a few tensor operations for all blocks at once."""
    import torch

    return (torch.stack([cap.logits[i] for i in cap.blocks]),
            torch.stack([cap.weights[i] for i in cap.blocks]),
            torch.stack([cap.indices[i] for i in cap.blocks]))


def check(cap: RouterCapture, moe: Moe) -> tuple[int, float]:
    """(block-positions whose recomputed choice differs from the router's, the largest weight
    difference over the others)."""
    import torch

    logits, weights, indices = _stacked(cap)
    nb, N, E = logits.shape
    if cap.biases:  # a bias per block: the rule runs block by block
        pairs = [route(logits[j], moe, cap.biases.get(i)) for j, i in enumerate(cap.blocks)]
        idx, w = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    else:
        idx, w = route(logits.view(nb * N, E), moe)
        idx, w = idx.view(nb, N, -1), w.view(nb, N, -1)
    a_idx, a_w = _by_expert(idx, w)
    b_idx, b_w = _by_expert(indices, weights)
    same = (a_idx == b_idx).all(dim=-1)  # (nb, N)
    mismatched = int((~same).sum())
    worst = float((a_w[same] - b_w[same]).abs().max()) if bool(same.any()) else 0.0
    return mismatched, worst


def routing_of_rows(cap: RouterCapture, moe: Moe, B: int, T: int,
                    lengths: Sequence[int], dtype: str) -> list[Routing]:
    """One Routing per batch row (rows left-padded to T; lengths: each row's real tokens),
    every MoE block and every real position."""
    import torch

    mismatched, worst = check(cap, moe)
    ok = mismatched == 0 and worst <= weight_tolerance(dtype)
    logits, weights, indices = _stacked(cap)  # (nb, N, E), (nb, N, k), (nb, N, k)
    nb, N, E = logits.shape
    p = route_distribution(logits.view(nb * N, E), moe)  # (nb·N, E)
    entropy = -(p * torch.log(p.clamp(min=1e-30))).sum(dim=-1)  # (nb·N,)
    w, order = weights.sort(dim=-1, descending=True)  # (nb, N, k)
    idx = indices.gather(-1, order)  # (nb, N, k)
    mass = p.gather(-1, idx.view(nb * N, -1)).sum(dim=-1)  # (nb·N,)
    idx_l = idx.view(nb, B, T, -1).tolist()
    w_l = w.view(nb, B, T, -1).tolist()
    mass_l = mass.view(nb, B, T).tolist()
    ent_l = entropy.view(nb, B, T).tolist()
    out = []
    for b, n in enumerate(lengths):
        start = T - n  # rows are left-padded: the real positions are the last n
        blocks = tuple(BlockRoute(
            layer=layer, experts=tuple(map(tuple, idx_l[j][b][start:])),
            weights=tuple(map(tuple, w_l[j][b][start:])), mass=tuple(mass_l[j][b][start:]),
            entropy=tuple(ent_l[j][b][start:])) for j, layer in enumerate(cap.blocks))
        out.append(Routing(
            n_experts=moe.n_experts, top_k=moe.top_k, n_shared=moe.n_shared,
            d_expert=moe.d_expert, scoring=moe.scoring.value, renormalised=moe.renormalise,
            blocks=blocks, checked=ok, mismatched=mismatched,
            max_weight_error=worst if math.isfinite(worst) else float("nan")))
    return out


def tally(cap: RouterCapture, moe: Moe, rows: torch.Tensor | None = None
          ) -> tuple[np.ndarray, int, np.ndarray]:
    """One pass's routing, counted: (load (blocks, E) int64 numpy, positions per expert; the
    positions counted; entropy (blocks,) float64 numpy, the sums of the router's entropy over
    them). rows: the flat (B·T) indices of the real positions (None: all)."""
    import numpy as np
    import torch

    logits, _, indices = _stacked(cap)  # (nb, N, E), (nb, N, k)
    if rows is not None:
        logits = logits.index_select(1, rows.to(logits.device))
        indices = indices.index_select(1, rows.to(indices.device))
    nb, N, E = logits.shape
    load = torch.zeros(nb, E, dtype=torch.int64, device=indices.device)
    load.scatter_add_(1, indices.reshape(nb, -1).long(), torch.ones_like(
        indices.reshape(nb, -1), dtype=torch.int64))
    p = route_distribution(logits.reshape(nb * N, E), moe).double()  # (nb·N, E)
    entropy = -(p * torch.log(p.clamp(min=1e-300))).sum(dim=-1).view(nb, N)  # (nb, N)
    return load.cpu().numpy(), N, entropy.sum(dim=-1).cpu().numpy().astype(np.float64)


ROUTES = ("renormalise", "next")  # what a position does without an expert it chose


def renormalises(moe: Moe) -> bool:
    """Whether the family's weights of the chosen experts always sum to the same (1, or its
    scale): renormalised top-k probabilities or scores, or gpt-oss's softmax over the top k."""
    return moe.renormalise or moe.scoring is Scoring.softmax_top_k


def without(logits: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, moe: Moe,
            removed: Sequence[int], how: str, bias: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's choice (indices (N, k), weights (N, k)) with the experts `removed` gone, at
    the positions that chose one of them (the others keep theirs, bit for bit):

    - `renormalise`: their weight is 0; where the family renormalises (renormalises()), the
      remaining chosen experts' weights are scaled back to the family's sum; where it does not,
      they keep theirs;
    - `next`: the family's rule runs again on the router's logits with the removed experts
      out of the choice: each such position takes its next choice, every weight as the rule
      gives it."""
    import torch

    gone = torch.zeros(logits.shape[-1], dtype=torch.bool, device=indices.device)
    gone[list(removed)] = True
    hit = gone[indices]  # (N, k): a removed expert in that slot
    rows = hit.any(dim=-1, keepdim=True)  # (N, 1)
    if how == "next":
        idx, w = route(logits, moe, bias, exclude=gone)
        return torch.where(rows, idx.to(indices.dtype), indices), \
            torch.where(rows, w.to(weights.dtype), weights)
    w = weights.masked_fill(hit, 0.0)  # (N, k)
    if renormalises(moe):
        total = w.float().sum(dim=-1, keepdim=True)  # (N, 1)
        scaled = torch.where(total > 0, w.float() / total.clamp(min=1e-30) * moe.scale,
                             torch.zeros_like(total))
        w = torch.where(rows, scaled.to(weights.dtype), weights)
    return indices, w


@dataclass
class LastRoute:
    """One MoE block at the last position of a clean pass: what its experts module received
    (x (C,), in the model's dtype) and its router's output there (logits (E,), weights (k,),
    indices (k,)), with the router's choice-only bias (or None)."""

    layer: int
    x: torch.Tensor
    logits: torch.Tensor
    weights: torch.Tensor
    indices: torch.Tensor
    bias: torch.Tensor | None


def last_route_hooks(parts: ModelParts, layers: Sequence[int], got: dict[int, dict]
                     ) -> list[Hook]:
    """Hooks that keep, for each MoE block of `layers`, the last row (the last position of a
    one-row batch) of its router's output (got[i]["route"]: logits, weights, indices) and of
    its experts module's input (got[i]["x"])."""
    found = dict(routers(parts))

    def keep_route(i: int):
        def hook(module: nn.Module, args: tuple, output: tuple) -> None:
            got.setdefault(i, {})["route"] = tuple(o[-1].detach().clone() for o in output[:3])
        return hook

    def keep_input(i: int):
        def hook(module: nn.Module, args: tuple) -> None:
            got.setdefault(i, {})["x"] = args[0][-1].detach().clone()
        return hook

    return [h for i in layers for h in (
        Hook.after(found[i], keep_route(i)),
        Hook.before(parts.mlps[i].get_submodule(parts.family.experts), keep_input(i)))]


def kept_routes(parts: ModelParts, got: dict[int, dict]) -> dict[int, LastRoute]:
    """What last_route_hooks kept, as LastRoute values."""
    found = dict(routers(parts))
    out = {}
    for i, kept in got.items():
        bias = score_bias(parts, found[i])
        logits, weights, indices = kept["route"]
        out[i] = LastRoute(layer=i, x=kept["x"], logits=logits, weights=weights,
                           indices=indices, bias=None if bias is None else bias.detach().float())
    return out


def shared_output(parts: ModelParts, layer: int, x: torch.Tensor) -> Any:
    """What the shared experts of block `layer` add on x (C,), their own gate included, by the
    model's own modules: (C,) float32, or None where the family has none."""
    import torch

    fam = parts.family
    if not fam.shared_experts:
        return None
    mlp = parts.mlps[layer]
    with torch.inference_mode():
        y = mlp.get_submodule(fam.shared_experts)(x[None])  # (1, C)
        if fam.shared_expert_gate:
            y = torch.sigmoid(mlp.get_submodule(fam.shared_expert_gate)(x[None])) * y
    return y[0].float()


def expert_output(parts: ModelParts, layer: int, x: torch.Tensor, e: int) -> torch.Tensor:
    """Routed expert e of block `layer` on x (C,), weight 1, by the model's own experts
    module: (C,) float32."""
    import torch

    experts = parts.mlps[layer].get_submodule(parts.family.experts)
    idx = torch.tensor([[e]], device=x.device)
    w = torch.ones(1, 1, device=x.device, dtype=x.dtype)
    with torch.inference_mode():
        return experts(x[None], idx, w)[0].float()


def choice_by_hand(r: LastRoute, moe: Moe, removed: Sequence[int], how: str
                   ) -> list[tuple[int, float]]:
    """One position's choice with the experts `removed` gone, (expert, weight) pairs, in plain
    Python from the router's logits and the family's rule as docs/ablate.md states it: a second
    computation, sharing no code with route() and without(), which the ablation's hooks run, so
    that the `ablated_experts` check holds the hooks to the rule rather than to themselves.

    `renormalise`: the chosen experts left, their weights scaled back to the family's sum
    where it renormalises. `next`: the rule again with the removed experts out of the choice,
    at most k taken from those that remain (fewer where fewer remain; none where none do)."""
    old = list(zip(r.indices.tolist(), r.weights.float().tolist(), strict=True))
    gone = set(removed)
    if not any(e in gone for e, _ in old):
        return old
    if how == "renormalise":
        kept = [(e, w) for e, w in old if e not in gone]
        total = sum(w for _, w in kept)
        if not renormalises(moe):
            return kept
        return [(e, w / total * moe.scale) for e, w in kept] if total > 0 else []
    x = [float(v) for v in r.logits.float().tolist()]
    remaining = [e for e in range(len(x)) if e not in gone]
    if not remaining:
        return []
    k = moe.top_k
    if moe.scoring is Scoring.softmax_top_k:  # the k largest logits left, a softmax of them
        chosen = sorted(remaining, key=lambda e: -x[e])[:k]
        top = max(x[e] for e in chosen)
        top_k = {e: math.exp(x[e] - top) for e in chosen}
        return [(e, top_k[e] / sum(top_k.values())) for e in chosen]
    if moe.scoring is Scoring.softmax:  # probabilities over all E, the k largest left
        top = max(x)
        ex = [math.exp(v - top) for v in x]
        p = [v / sum(ex) for v in ex]
        chosen = sorted(remaining, key=lambda e: -p[e])[:k]
        w = {e: p[e] for e in chosen}
    else:  # sigmoid scores, the choice by score + bias within the best groups
        sc = [1.0 / (1.0 + math.exp(-v)) for v in x]
        b = [0.0] * len(x) if r.bias is None else [float(v) for v in r.bias.tolist()]
        key = {e: sc[e] + b[e] for e in remaining}
        if moe.n_groups > 1:
            size = len(x) // moe.n_groups
            worth = {}
            for g in range(moe.n_groups):
                inside = sorted((key[e] for e in remaining if e // size == g), reverse=True)
                if inside:  # a group with no expert left is out of the choice
                    worth[g] = sum(inside[:2])
            best = set(sorted(worth, key=lambda g: -worth[g])[:moe.topk_groups])
            key = {e: v for e, v in key.items() if e // size in best}
        chosen = sorted(key, key=lambda e: -key[e])[:k]
        w = {e: sc[e] for e in chosen}
    if moe.renormalise:
        total = sum(w.values())
        w = {e: v / total for e, v in w.items()}
    return [(e, v * moe.scale) for e, v in w.items()]


def removal_change(parts: ModelParts, config: PretrainedConfig, r: LastRoute,
                   removed: Sequence[int], how: str) -> torch.Tensor:
    """What the MoE block's output at that position becomes minus what it was, (C,) float32,
    when the experts `removed` are gone (choice_by_hand(); nothing else changed): Σ over the
    new choice of w'_e·y_e − Σ over the old of w_e·y_e, each y_e from the experts module."""
    moe = moe_facts(parts, config)
    assert moe is not None
    total: Any = 0
    for e, weight in choice_by_hand(r, moe, removed, how):
        total = total + weight * expert_output(parts, r.layer, r.x, e)
    for e, weight in zip(r.indices.tolist(), r.weights.float().tolist(), strict=True):
        total = total - weight * expert_output(parts, r.layer, r.x, e)
    return total


__all__ = ["ROUTES", "LastRoute", "capture_routing", "choice_by_hand", "expert_output",
           "kept_routes", "last_route_hooks", "moe_facts", "removal_change", "renormalises",
           "route", "routers", "routing_of_rows", "shared_output", "tally", "without"]
