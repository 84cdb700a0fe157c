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
from typing import Any

from fptrace.core.hooks import Hook, hooked
from fptrace.families import Moe
from fptrace.families.ops import route, route_distribution
from fptrace.families.parts import ModelParts
from fptrace.results import BlockRoute, Routing


def moe_facts(parts: ModelParts, config: Any) -> Moe | None:
    """The config's MoE facts, or None for a dense model (or a family without them)."""
    fam = parts.family
    return fam.moe(config) if fam.moe is not None else None


def routers(parts: ModelParts) -> list[tuple[int, Any]]:
    """(block index, router module) of every MoE block: those whose MLP has the family's
    router (DeepSeek-V3's first blocks are dense and have none)."""
    out = []
    for i, mlp in enumerate(parts.mlps):
        try:
            out.append((i, mlp.get_submodule(parts.family.router)))
        except AttributeError:
            continue
    return out


def score_bias(parts: ModelParts, router: Any) -> Any:
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
def capture_routing(parts: ModelParts, config: Any) -> Iterator[RouterCapture | None]:
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
        def keep(module: Any, args: tuple, output: Any) -> None:
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


def _by_expert(idx: Any, w: Any) -> tuple[Any, Any]:
    """Both sorted by expert id, to compare two choices whatever their order."""
    order = idx.argsort(dim=-1)
    return idx.gather(-1, order), w.gather(-1, order)


def weight_tolerance(dtype: str) -> float:
    """How far a recomputed weight may differ from the router's (its dtype's rounding)."""
    return 1e-5 if dtype == "float32" else 2e-2


def _stacked(cap: RouterCapture) -> tuple[Any, Any, Any]:
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


__all__ = ["capture_routing", "moe_facts", "route", "routers", "routing_of_rows"]
