"""Changing the forward pass, the one way `steer`, `ablate`, the report and the TUI do it.

- Steering adds a vector to the output of block L: the residual stream after the block's last
  residual add (for post-norm families, Gemma 2/3 and OLMo 2, after the post-norms: the place
  the stream is), at every position or at the positions chosen. llama.cpp adds its control
  vectors at the same place.
- Ablating an attention head sets its columns of W_O's input (the heads side by side, before
  the attention output projection) to zero or to their mean: what the head wrote through W_O is
  gone (or is its mean write); the W_O bias, which belongs to no head, stays.
- Ablating an MLP sets the output the stream receives from it (the post-norm's, where the
  family has one) to zero or to its mean.

Every row of a batch gets its own change (a strength per row, a set of removed parts per row),
so a sweep of strengths or a grid of ablated parts takes one or a few forward passes. The hooks
are prepended (hooks.hooked(prepend=True)): everything else that reads the forward pass
(fptrace's statistics, transformers' output_hidden_states) sees the changed values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fptrace.addresses import (
    Block,
    Expert,
    Head,
    Site,
    many,
    resolve_block,
    resolve_expert,
    resolve_head,
)
from fptrace.core.hooks import Capture, Hook, capture_stats, first_output, hooked, is_oom
from fptrace.core.taps import SiteFn, hooks_at, received
from fptrace.core.trace import sizes
from fptrace.errors import BadInput
from fptrace.families.parts import dims
from fptrace.models.loading import LoadedModel
from fptrace.points import Point

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch import nn

MODES = ("zero", "mean")


@dataclass(frozen=True)
class Part:
    """A part that can be removed: attention head `head` of block `layer`, routed expert
    `expert` of its mixture of experts, or (both None) the MLP of block `layer`."""

    layer: int
    head: int | None = None
    expert: int | None = None

    @property
    def order(self) -> tuple[int, int, int]:
        """Stream order: by block, a block's heads, then its experts, then its MLP."""
        if self.head is not None:
            return (self.layer, 0, self.head)
        return (self.layer, 1, self.expert) if self.expert is not None else (self.layer, 2, 0)

    @property
    def is_mlp(self) -> bool:
        return self.head is None and self.expert is None

    @property
    def label(self) -> str:
        """`L.H` for a head, `L3E4` for an expert, `mlp L` for an MLP."""
        if self.expert is not None:
            return str(Expert(self.layer, self.expert))
        return f"mlp {self.layer}" if self.head is None else str(Head(self.layer, self.head))


def _blocks(lm: LoadedModel) -> int:
    return len(lm.parts.blocks)


def parts_of(lm: LoadedModel, heads: Sequence[Head], mlps: Sequence[int | Block],
             experts: Sequence[Expert] = ()) -> list[Part]:
    """The parts named by the API's `heads=` (Head values), `mlps=` (blocks) and `experts=`
    (Expert values), checked against the model (negative blocks and heads count from the
    end; an expert's block must be one with a router)."""
    from fptrace.core.routing import routers

    sz = sizes(lm)
    chosen = [resolve_head(h, sz, "heads") for h in many(heads, Head, "heads")]
    blocks = [resolve_block(m, sz, "mlps") for m in many(mlps, Block, "mlps")]
    routed = [resolve_expert(e, sz, "experts") for e in many(experts, Expert, "experts")]
    if routed:
        moe_blocks = [i for i, _ in routers(lm.parts)]
        for e in routed:
            if e.layer not in moe_blocks:
                where = e.origin or f"experts: {e!r}"
                raise BadInput(f"{where}: block {e.layer} of {lm.name} is dense (no router); its "
                               f"mixture-of-experts blocks are {_ranges(moe_blocks)}")
    return [Part(h.layer, h.head) for h in chosen] + [Part(b.layer) for b in blocks] + \
        [Part(e.layer, expert=e.expert) for e in routed]


def _ranges(blocks: Sequence[int]) -> str:
    """`1-26` for consecutive blocks, else the list."""
    if blocks and list(blocks) == list(range(blocks[0], blocks[-1] + 1)) and len(blocks) > 2:
        return f"{blocks[0]}-{blocks[-1]}"
    return ", ".join(map(str, blocks)) or "none"


# ----------------------------------------------------------------------------- steering
def steering_hooks(lm: LoadedModel, vectors: dict[int, torch.Tensor], strengths: Sequence[float],
                   positions: tuple[int, ...] | None) -> list[Hook]:
    """Hooks that add strengths[r] · vectors[L] to the output of block L in batch row r, at
    every position (positions None) or at those prompt positions."""
    import torch

    s = torch.tensor(list(strengths), dtype=torch.float32)[:, None, None]  # (B, 1, 1)
    vs = {L: v.float() for L, v in vectors.items()}

    def add(site: Site, h: torch.Tensor | None) -> torch.Tensor:
        assert h is not None  # (B, T, d): a block's output
        delta = (s.to(h.device) * vs[site.layer].to(h.device)).to(h.dtype)  # (B, 1, d)
        if positions is None:
            return h + delta
        new = h.clone()
        new[:, list(positions)] = h[:, list(positions)] + delta
        return new

    return hooks_at(lm, [Site(L, Point.resid_post) for L in vs], add)


# ----------------------------------------------------------------------------- ablation
@dataclass
class Means:
    """What mean ablation puts in place of a part: its output averaged over positions."""

    heads: list  # per block: (nh·hd,) float32, the mean of W_O's input (every head's output)
    mlps: list  # per block: (d,) float32, the mean of what the stream received from the MLP
    positions: int  # how many positions were averaged


def mean_outputs(lm: LoadedModel, prompts: Sequence[Sequence[int]]) -> Means:
    """The mean, over every position of the prompts (token ids, run one at a time), of each
    block's W_O input and of what each block's MLP added."""
    import torch

    n = _blocks(lm)
    sums: dict[str, list] = {"heads": [None] * n, "mlps": [None] * n}

    def keep(site: Site, x: torch.Tensor | None) -> None:
        assert x is not None
        store = sums["heads"] if site.point is Point.z else sums["mlps"]
        total = x.float().sum(dim=(0, 1))
        store[site.layer] = total if store[site.layer] is None else store[site.layer] + total

    hooks = hooks_at(lm, [s for i in range(n) for s in (Site(i, Point.z),
                                                         received(lm, i, "mlp"))], keep)
    count = 0
    with torch.inference_mode(), hooked(hooks):
        for ids in prompts:
            lm.model(torch.tensor([list(ids)], device=lm.device), use_cache=False,
                     logits_to_keep=1)
            count += len(ids)
    return Means(heads=[x / count for x in sums["heads"]],
                 mlps=[x / count for x in sums["mlps"]], positions=count)


def ablation_hooks(lm: LoadedModel, rows: Sequence[Sequence[Part]], means: Means | None,
                   route: str = "renormalise", positions: Sequence[int] | None = None
                   ) -> list[Hook]:
    """Hooks that remove, in batch row r, every part of rows[r]: zero (means None) or mean; a
    routed expert by its router's choice (core/routing.without: `renormalise` or `next`). A head
    or an MLP is removed at every position of the input (positions None) or at those positions
    only (the others keep what the pass computed); an expert at every position."""
    import torch

    if positions is not None and any(p.expert is not None for ps in rows for p in ps):
        raise ValueError("ablation_hooks: positions apply to heads and MLPs, not experts")

    B = len(rows)
    dm = dims(lm.config, lm.parts.family)
    hd = dm.head_dim
    by_layer: dict[int, list[tuple[int, Part]]] = {}
    for r, parts in enumerate(rows):
        for p in parts:
            by_layer.setdefault(p.layer, []).append((r, p))
    hooks: list[Hook] = []
    for layer, items in sorted(by_layer.items()):
        heads = [(r, p.head) for r, p in items if p.head is not None]
        mlps = sorted({r for r, p in items if p.is_mlp})
        experts: dict[int, list[int]] = {}
        for r, p in items:
            if p.expert is not None:
                experts.setdefault(r, []).append(p.expert)
        if experts:
            hooks.append(_expert_removal(lm, layer, B, experts, route))
        if heads:
            width = dm.n_heads * hd
            keep = torch.ones(B, 1, width, dtype=torch.bool)
            for r, h in heads:
                keep[r, 0, h * hd:(h + 1) * hd] = False
            fill = torch.zeros(B, 1, width)
            if means is not None:
                fill[:] = means.heads[layer].cpu()
            hooks += hooks_at(lm, [Site(layer, Point.z)], _replace(keep, fill, positions))
        if mlps:
            keep = torch.ones(B, 1, 1, dtype=torch.bool)
            keep[mlps] = False
            fill = torch.zeros(B, 1, dm.d_model)
            if means is not None:
                fill[:] = means.mlps[layer].cpu()
            hooks += hooks_at(lm, [received(lm, layer, "mlp")], _replace(keep, fill, positions))
    return hooks


def latent_removal_hooks(lm: LoadedModel, block: int,
                         encode: Callable[[torch.Tensor], torch.Tensor], direction: torch.Tensor,
                         rows: Sequence[int], store: dict) -> list[Hook]:
    """Hooks that, in the batch rows `rows`, subtract from block `block`'s output, at every
    position, a·direction with a = encode(that output) (B, T): what one dictionary latent wrote
    there (`ablate --sae DIR --latent N`). store["a"] gets the activations (B, T) float32."""
    import torch

    def remove(site: Site, h: torch.Tensor | None) -> torch.Tensor:
        assert h is not None  # (B, T, d): the block's output
        a = encode(h.float())  # (B, T)
        store["a"] = a.detach().clone()
        mask = torch.zeros(h.shape[0], 1, 1, device=h.device)
        mask[list(rows)] = 1.0
        return h - (mask * a[..., None] * direction.to(h.device)).to(h.dtype)  # (B, T, d)
    return hooks_at(lm, [Site(block, Point.resid_post)], remove)


def _expert_removal(lm: LoadedModel, layer: int, B: int, removed: dict[int, list[int]],
                    how: str) -> Hook:
    """A hook on block `layer`'s router: in batch row r, the experts removed[r] are gone from
    what it hands the experts (its logits unchanged)."""
    import torch

    from fptrace.core.routing import moe_facts, routers, score_bias, without

    router = dict(routers(lm.parts))[layer]
    moe = moe_facts(lm.parts, lm.config)
    assert moe is not None  # parts_of takes experts of MoE blocks only
    bias = score_bias(lm.parts, router)
    sets: dict[tuple[int, ...], list[int]] = {}
    for r, es in removed.items():
        sets.setdefault(tuple(sorted(set(es))), []).append(r)

    def hook(module: nn.Module, args: tuple, output: tuple) -> tuple:
        logits, weights, indices = output[0], output[1], output[2]  # (N, E), (N, k), (N, k)
        T = indices.shape[0] // B  # the rows are B copies of T positions, row-major
        w, idx = weights, indices
        for es, rs in sets.items():
            row = torch.zeros(B, dtype=torch.bool, device=indices.device)
            row[rs] = True
            row = row.repeat_interleave(T)[:, None]  # (N, 1)
            i2, w2 = without(logits, weights, indices, moe, es, how,
                             None if bias is None else bias.float())
            idx, w = torch.where(row, i2, idx), torch.where(row, w2, w)
        return (logits, w, idx, *output[3:])
    return Hook.after(router, hook)


def _replace(keep: torch.Tensor, fill: torch.Tensor, positions: Sequence[int] | None) -> SiteFn:
    """Where keep is False, fill in place of the tensor (W_O's input (B, T, nh·hd), or what
    the stream receives from the MLP (B, T, d)), at every position or at `positions`."""
    import torch

    def replace(site: Site, x: torch.Tensor | None) -> torch.Tensor:
        assert x is not None
        if positions is None:
            return torch.where(keep.to(x.device), x, fill.to(x.device, x.dtype))
        at = list(positions)
        new = x.clone()
        new[:, at] = torch.where(keep.to(x.device), x[:, at], fill.to(x.device, x.dtype))
        return new
    return replace


# ----------------------------------------------------------------------------- running
@dataclass
class Rows:
    """One batched forward pass of a prompt, every row changed its own way."""

    logits: torch.Tensor  # (B, V) float32: the model's last-position logits (after any softcap)
    pre_cap: torch.Tensor  # (B, V) float32: the LM head's output, before any final softcap
    cap: Capture  # per-block statistics of every row (the stream at the last position, ...)


def check_rows_fit(lm: LoadedModel, B: int, T: int, what: str, lower: str,
                   extra_bytes: int = 0) -> None:
    """Refuse a batch that would not fit in memory, before it runs, saying what to lower."""
    import torch

    from fptrace.models.memory import check_forward_fits

    check_forward_fits(lm.config, lm.device, torch.empty((), dtype=lm.dtype).element_size(),
                       B, T, what, lower, extra_bytes)


def run_rows(lm: LoadedModel, ids: Sequence[int], B: int, hooks: list[Hook],
             lower: str) -> Rows:
    """B copies of the prompt in one forward pass with the intervention hooks (prepended) and
    fptrace's per-block statistics; running out of memory says what to lower."""
    import torch

    cap = Capture(mask=None, home=lm.device)
    got: dict[str, Any] = {}

    def head_output(module: nn.Module, args: tuple, output: object) -> None:
        got["pre_cap"] = first_output(output)[:, -1].float()  # (B, V)

    input_ids = torch.tensor([list(ids)] * B, device=lm.device)
    try:
        with torch.inference_mode(), hooked(hooks, prepend=True), \
                hooked([Hook.after(lm.parts.lm_head, head_output)]), \
                capture_stats(lm.parts, cap):
            logits = lm.model(input_ids, use_cache=False, logits_to_keep=1).logits[:, -1]
    except Exception as e:
        if not is_oom(e):
            raise
        from fptrace.errors import OutOfMemory
        from fptrace.models.memory import out_of_memory

        raise OutOfMemory(out_of_memory(lm.config, lm.device, B, len(ids), 1,
                                        torch.empty((), dtype=lm.dtype).element_size())
                          + f"; or {lower}") from None
    return Rows(logits=logits.float(), pre_cap=got["pre_cap"], cap=cap)


def check_continuation(lm: LoadedModel, T: int, n: int) -> None:
    if n < 0:
        raise BadInput(f"-n must be 0 or more, not {n}")
    ctx = getattr(lm.config, "max_position_embeddings", None)
    if ctx and T + n > ctx:
        raise BadInput(f"the prompt is {T} tokens and -n {n} would reach position {T + n - 1}, "
                       f"beyond the context window of {ctx}; use -n {max(ctx - T, 0)} or less")


def continue_greedy(lm: LoadedModel, ids: Sequence[int], first: Sequence[int], n: int,
                    hooks: list[Hook]) -> list[list[int]]:
    """Greedy continuations of n tokens, one per row, every row changed by the same hooks as
    the pass that chose `first` (each row's first token): n − 1 more forward passes over the
    whole sequence (no KV cache, so a hook on every position also changes the new tokens)."""
    import torch

    rows = [list(ids) + [int(f)] for f in first]
    with torch.inference_mode(), hooked(hooks, prepend=True):
        for _ in range(n - 1):
            x = torch.tensor(rows, device=lm.device)
            nxt = lm.model(x, use_cache=False, logits_to_keep=1).logits[:, -1].argmax(-1)
            for row, t in zip(rows, nxt.tolist()):
                row.append(int(t))
    return [row[len(ids):] for row in rows]


__all__ = ["Part", "ablation_hooks", "mean_outputs", "parts_of", "run_rows", "steering_hooks"]
