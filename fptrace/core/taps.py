"""Hooks at places: `hooks_at(lm, sites, fn)`, the one way a command reads or changes the tensor
at an addresses.Site during a forward pass (features, diff --deep, stats, steer and ablate).

A site is found on the family's taps (Family.block_taps: which module of the block shows the
point, its input or its output, which element of a tuple, which slice of a fused projection).
Where the family names no module for a point every block has, the model's parts stand in: the
MLP's input (ln2) is the MLP module's input (OLMo 2 has no norm before it), what the stream
receives from attention or the MLP (attn_out, mlp_out) the module the parts say it receives it
from, W_O's input (z) the attention's output projection (a model of no registered family).

fn(site, x) sees that tensor; returning a tensor puts it in the tensor's place (steering,
ablation), returning None leaves the pass as it is. Where the module returned no such element
(the attention weights when attention is not eager), fn sees None.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from fptrace.addresses import Site
from fptrace.core.hooks import Hook
from fptrace.errors import UnsupportedModel
from fptrace.families import Tap
from fptrace.families.parts import output_projection
from fptrace.points import Point

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fptrace.models.loading import LoadedModel

SiteFn = Callable[[Site, "torch.Tensor | None"], "torch.Tensor | None"]
TensorFn = Callable[["torch.Tensor | None"], "torch.Tensor | None"]


def received(lm: LoadedModel, layer: int, side: str) -> Site:
    """The place where the stream receives what attention (side "attn") or the MLP ("mlp") of
    block `layer` adds: the post-norm's output where the family has one (ln1_post, ln2_post),
    else the sublayer's own output (attn_out, mlp_out)."""
    fam = lm.parts.family
    if side == "attn":
        return Site(layer, Point.ln1_post if fam.attn_added else Point.attn_out)
    return Site(layer, Point.ln2_post if fam.mlp_added else Point.mlp_out)


def tap_at(lm: LoadedModel, site: Site) -> tuple[nn.Module, Tap]:
    """The module that shows `site`, and which of its tensors (see the module's text)."""
    parts = lm.parts
    block = parts.blocks[site.layer]
    tap = parts.family.block_taps(parts.parallel_residual).get(site.point)
    if tap is not None:
        return (block.get_submodule(tap.module) if tap.module else block), tap
    if site.point is Point.ln2:
        return parts.mlps[site.layer], Tap("", "in")
    if site.point is Point.mlp_out:
        return parts.mlp_adds[site.layer], Tap("")
    if site.point is Point.attn_out:
        return parts.attn_adds[site.layer], Tap("")
    if site.point is Point.z:
        return output_projection(parts.attns[site.layer], parts.family.w_o)[0], Tap("", "in")
    raise UnsupportedModel(f"the {parts.family.name} family shows {site.point.value} in no "
                           "module of its blocks")


def tap_hook(module: nn.Module, tap: Tap, fn: TensorFn) -> Hook:
    """One hook on `module` that hands fn the tensor `tap` names (its input, or an element of
    its output, or a slice of it) and puts what fn returns in its place."""
    if tap.side == "in":
        def pre(m: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            if args:
                new = fn(_part(args[0], tap))
                return None if new is None else ((_whole(new, tap), *args[1:]), kwargs)
            key = "hidden_states" if "hidden_states" in kwargs else next(iter(kwargs))
            new = fn(_part(kwargs[key], tap))
            return None if new is None else (args, {**kwargs, key: _whole(new, tap)})
        return Hook.before(module, pre, kwargs=True)

    def post(m: nn.Module, args: tuple, output: torch.Tensor | tuple | list) -> object:
        if not isinstance(output, (tuple, list)):
            new = fn(_part(output, tap) if tap.item == 0 else None)
            return None if new is None else _whole(new, tap)
        new = fn(_part(output[tap.item], tap) if tap.item < len(output) else None)
        if new is None:
            return None
        out = list(output)
        out[tap.item] = _whole(new, tap)
        return out if isinstance(output, list) else tuple(out)
    return Hook.after(module, post)


def _part(x: torch.Tensor, tap: Tap) -> torch.Tensor:
    if tap.part is None:
        return x
    i, n = tap.part
    return x.chunk(n, dim=-1)[i]


def _whole(new: torch.Tensor, tap: Tap) -> torch.Tensor:
    if tap.part is not None:  # no caller writes into a slice of a fused projection
        raise UnsupportedModel("a hook cannot replace one slice of a fused projection's output")
    return new


def hooks_at(lm: LoadedModel, sites: Iterable[Site], fn: SiteFn) -> list[Hook]:
    """One hook per site, in the order given: fn(site, x) sees the tensor at the site and may
    return its replacement (see the module's text). Register them with hooks.hooked (prepend
    them when they change the pass)."""
    hooks = []
    for site in sites:
        module, tap = tap_at(lm, site)
        hooks.append(tap_hook(module, tap, _bound(fn, site)))
    return hooks


def _bound(fn: SiteFn, site: Site) -> TensorFn:
    return lambda x: fn(site, x)


__all__ = ["hooks_at", "received", "tap_at", "tap_hook"]
