"""The edges into a batch of target nodes: one backward pass of the frozen model per batch.

The frozen pass (freezing.py) runs the prompt once; each batch of targets (a neuron's
activation, or a logit) is one vector-Jacobian product of that pass, batched over targets with
autograd's `is_grads_batched` (the forward is not replicated). For each target the gradient at
every source, times the source's value, is its edge: the token embeddings per position, each
neuron's activation, and the bias terms (each bias times the gradient of its module's output,
summed). By Euler's theorem for the linear model the frozen pass is, a target's edges plus its
bias terms are its value: `Rows.total` is that sum, which core.py checks against the real
model's value.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from fptrace.commands.graph.freezing import Pass

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass(frozen=True)
class Target:
    """A node whose incoming edges are computed: a neuron (layer, position, neuron) or a logit
    (layer None, the index of its query position, its token id)."""

    layer: int | None
    position: int  # a neuron's position; a logit's index among the query positions
    index: int  # the neuron, or the token id


@dataclass(frozen=True)
class Candidates:
    """The neurons (latents) whose edges are kept one by one, the graph's candidate nodes: at
    each (layer, position) the `k` of largest |activation| whose activation is not zero (a
    node that is zero has no outgoing edge; with transcoders most latents are), C in all, in
    (layer, position, |activation|) order. Every other neuron's (latent's) edge is summed in
    its site's remainder."""

    layer: np.ndarray  # (C,) int64
    position: np.ndarray  # (C,)
    index: np.ndarray  # (C,) the neuron or latent
    L: int
    T: int

    @classmethod
    def top(cls, acts: torch.Tensor, k: int) -> Candidates:
        """The candidates of the activations acts (L, T, m), a torch tensor."""
        top = acts.abs().topk(k, dim=-1)
        layer, pos, slot = (top.values > 0).nonzero(as_tuple=True)
        L, T, _ = acts.shape
        return cls(layer.cpu().numpy(), pos.cpu().numpy(),
                   top.indices[layer, pos, slot].cpu().numpy(), L, T)

    def __len__(self) -> int:
        return len(self.index)

    def target(self, c: int) -> Target:
        return Target(int(self.layer[c]), int(self.position[c]), int(self.index[c]))

    @cached_property
    def site(self) -> np.ndarray:
        """(C,) each candidate's site, layer · T + position."""
        return self.layer * self.T + self.position

    @cached_property
    def columns(self) -> dict[Target, int]:
        """Each candidate's column (its place among the candidates)."""
        return {self.target(c): c for c in range(len(self))}

    @cached_property
    def by_layer(self) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per layer, torch long tensors: the candidates' columns, positions and indices."""
        import numpy as np
        import torch

        out = {}
        for layer in np.unique(self.layer).tolist():
            c = np.flatnonzero(self.layer == layer)
            out[layer] = (torch.from_numpy(c), torch.from_numpy(self.position[c]),
                          torch.from_numpy(self.index[c]))
        return out

    def per_site(self, row: np.ndarray) -> np.ndarray:
        """(L · T,) the sum of a candidate-level `row` (C,) over each site's candidates."""
        import numpy as np

        return np.bincount(self.site, weights=row, minlength=self.L * self.T)


@dataclass(frozen=True)
class Rows:
    """The incoming edges of n targets, in float64 (numpy arrays, n first).

    tokens (n, T): from each position's token embedding; chosen (n, C): from each candidate
    (Candidates); sites (n, L, T): from every neuron or latent of a (layer,
    position), chosen or not; errors (n, L, T): from each (layer, position)'s transcoder error
    (zeros for neurons); bias (n,): the bias terms (and a learned position embedding)."""

    tokens: np.ndarray
    chosen: np.ndarray
    sites: np.ndarray
    errors: np.ndarray
    bias: np.ndarray

    @property
    def total(self) -> np.ndarray:
        """(n,) each target's edges from all sources plus its bias terms."""
        return self.tokens.sum(1) + self.sites.sum((1, 2)) + self.errors.sum((1, 2)) + self.bias

    @property
    def sizes(self) -> np.ndarray:
        """(n,) Σ|terms| of each target's sum (its edges and its bias terms): the scale of the
        rounding a check of that sum allows."""
        import numpy as np

        return (np.abs(self.tokens).sum(1) + np.abs(self.sites).sum((1, 2))
                + np.abs(self.errors).sum((1, 2)) + np.abs(self.bias))

    @property
    def terms(self) -> float:
        """Σ|terms| of the first target's sum (core.py's graph_sums, verify.py's
        graph_verify)."""
        return float(self.sizes[0])

    def misses(self, values: np.ndarray) -> np.ndarray:
        """(n,) each target's |Σ edges + bias − value| / max(|value|, 1e-6 · Σ|terms|): what
        core.py's graph_sums holds to its RTOL, `values` (n,) the targets' values in the
        model."""
        import numpy as np

        return np.abs(self.total - values) / np.maximum(
            np.maximum(np.abs(values), 1e-6 * self.sizes), 1e-300)

    def row(self, b: int) -> Rows:
        """Target b's rows alone, one row each, copied (so that a batch's arrays are not kept
        alive by the rows kept of it)."""
        return Rows(tokens=self.tokens[b:b + 1].copy(), chosen=self.chosen[b:b + 1].copy(),
                    sites=self.sites[b:b + 1].copy(), errors=self.errors[b:b + 1].copy(),
                    bias=self.bias[b:b + 1].copy())

    def with_rows(self, at: np.ndarray, other: Rows) -> Rows:
        """These rows with rows `at` (k,) replaced by other's k rows."""
        out = {}
        for name in ("tokens", "chosen", "sites", "errors", "bias"):
            mine = getattr(self, name).copy()
            mine[at] = getattr(other, name)
            out[name] = mine
        return Rows(**out)


def columns_of(p: Pass, layer: int | None,
             index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The columns of block `layer`'s acts and leaves in the pass that hold the neurons
    (latents) `index` (a long tensor), and whether each is there (Pass.columns)."""
    import torch

    kept = p.columns.get(layer)
    if layer is None or kept is None:
        return index, torch.ones(index.shape, dtype=torch.bool)
    index = index.to(kept.device)
    col = torch.searchsorted(kept, index).clamp(max=max(len(kept) - 1, 0))
    there = kept[col] == index if len(kept) else torch.zeros(index.shape, dtype=torch.bool)
    return col, there


def seeds(p: Pass, targets: list[Target]) -> tuple[list, list]:
    """The outputs of the pass that hold the targets (each block's activations, the logits)
    and, per output, the batched seeds (n, *output's shape) of a backward pass: target b's 1
    at its place in row b."""
    import torch

    n = len(targets)
    outputs, grads = [], []
    by_layer: dict[int | None, list[tuple[int, Target]]] = {}
    for b, t in enumerate(targets):
        by_layer.setdefault(t.layer, []).append((b, t))
    for layer, ts in by_layer.items():
        out = p.logits if layer is None else p.acts[layer]  # (1, T or Q, m or V)
        g = torch.zeros((n, *out.shape), dtype=out.dtype, device=out.device)  # (n, 1, T, m)
        for b, t in ts:
            col, there = columns_of(p, layer, torch.tensor([t.index]))
            if bool(there[0]):  # else no seed: its row sums to its bias terms, and the
                g[b, 0, t.position, int(col[0])] = 1.0  # check fails where the value is not 0
        outputs.append(out)
        grads.append(g)
    return outputs, grads


def rows(p: Pass, targets: list[Target], cand: Candidates) -> Rows:
    """The Rows of `targets` from the frozen pass p; cand: the neurons (latents) whose edges are
    kept one by one. p may be a pass of the prompt's first positions only (core.py: a target
    at position t has no edge from a later position, the model being causal), its targets
    within it; the rows are of every position, those past p's zero."""
    import torch

    n = len(targets)
    L, T = cand.L, cand.T
    Tp = p.embed.shape[1]  # the pass's positions
    top = max((t.layer for t in targets if t.layer is not None), default=None)
    any_logit = any(t.layer is None for t in targets)
    layers = sorted(p.leaves) if any_logit else [l for l in sorted(p.leaves) if l < top]
    outputs, grads = seeds(p, targets)
    err_layers = sorted(p.errors) if any_logit else [l for l in sorted(p.errors) if l < top]
    inputs = [p.embed] + ([p.pos] if p.pos is not None else []) + \
        [p.leaves[l] for l in layers] + [p.errors[l] for l in err_layers] + \
        [out for _, out in p.biases]
    got = torch.autograd.grad(outputs, inputs, grads, retain_graph=True, allow_unused=True,
                              is_grads_batched=True)
    g_embed, got = got[0], got[1:]
    tokens = torch.zeros((n, T), dtype=g_embed.dtype, device=g_embed.device)
    tokens[:, :Tp] = (g_embed * p.embed).sum(-1)[:, 0]  # (n, Tp)
    bias = torch.zeros(n, dtype=tokens.dtype, device=tokens.device)
    if p.pos is not None:
        bias += (got[0] * p.pos).sum((1, 2, 3))
        got = got[1:]
    sites = torch.zeros((n, L, T), dtype=tokens.dtype, device=tokens.device)
    kept = torch.zeros((n, len(cand)), dtype=tokens.dtype, device=tokens.device)
    errors = torch.zeros((n, L, T), dtype=tokens.dtype, device=tokens.device)
    for layer, g in zip(layers, got[:len(layers)], strict=True):
        if g is None:
            continue
        e = (g * p.leaves[layer])[:, 0]  # (n, Tp, m): each neuron's edge
        sites[:, layer, :Tp] = e.sum(-1)
        if layer in cand.by_layer and e.shape[-1]:
            c, pos, idx = (x.to(e.device) for x in cand.by_layer[layer])
            inside = pos < Tp
            c, pos, idx = c[inside], pos[inside], idx[inside]
            col, there = columns_of(p, layer, idx)
            kept[:, c] = e[:, pos, col] * there
    got = got[len(layers):]
    for layer, g in zip(err_layers, got[:len(err_layers)], strict=True):
        if g is not None:
            errors[:, layer, :Tp] = (g * p.errors[layer])[:, 0].sum(-1)  # (n, Tp)
    for (b, _), g in zip(p.biases, got[len(err_layers):], strict=True):
        if g is not None:
            bias += (g * b).reshape(n, -1).sum(1)
    def out(t: torch.Tensor) -> np.ndarray:  # float64 whatever the pass's dtype
        return t.detach().cpu().to(torch.float64).numpy()

    return Rows(tokens=out(tokens), chosen=out(kept), sites=out(sites), errors=out(errors),
                bias=out(bias))


__all__ = ["Candidates", "Rows", "Target", "columns_of", "rows", "seeds"]
