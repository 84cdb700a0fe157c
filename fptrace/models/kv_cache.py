"""The model's own KV cache, the way fptrace passes it: transformers 5 renamed the forward's
`past_key_values` parameter to `cache`; `cache_kwarg` reads which one the forward takes, and
`cache_kwargs` gives a forward its cache (or none) under that name.
`plain_cache` is a fresh cache of the model's own layout where every layer is a plain growing
cache (keys and values of every earlier position, appended to by each forward), the layout whose
rows a caller may copy and extend: None where a layer keeps less or something else (a sliding
window, linear attention, keys shared across layers) or the forward takes no cache.
`cached_rows` reads one row's keys and values of the first positions out of such a cache, and
`cache_of` makes a new cache of such rows (a forward appends to it, never to the rows)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import DynamicCache

    from fptrace.models.loading import LoadedModel


def cache_kwarg(model: nn.Module) -> str | None:
    """The name of the forward's cache parameter (`cache`, `past_key_values`), or None."""
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


def cache_kwargs(model: nn.Module, cache: DynamicCache | None) -> dict:
    """The forward's keyword arguments for `cache`: it used and filled under the forward's own
    name for it (cache_kwarg; `past_key_values` where the signature names neither), or, with
    None, no cache at all."""
    if cache is None:
        return {"use_cache": False}
    return {"use_cache": True, cache_kwarg(model) or "past_key_values": cache}


def plain_cache(lm: LoadedModel) -> DynamicCache | None:
    """A new empty DynamicCache laid out by the model's config, one plain growing layer per
    block; None where the forward takes no cache or a layer is of another kind."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    if cache_kwarg(lm.model) is None:
        return None
    cache = DynamicCache(config=lm.config)
    layers = getattr(cache, "layers", None)
    if layers is None or len(layers) != len(lm.parts.blocks) or \
            any(type(layer) is not DynamicLayer for layer in layers):
        return None
    return cache


def cached_rows(cache: DynamicCache, row: int, upto: int
                ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batch row `row`'s keys and values of positions 0 … upto − 1, layer by layer, each
    (1, KV heads, upto, head dim), from a cache of plain layers (plain_cache) after a pass."""
    from transformers.cache_utils import DynamicLayer

    out = []
    for layer in cache.layers:
        assert isinstance(layer, DynamicLayer) and layer.keys is not None \
            and layer.values is not None  # plain_cache's layers, filled by the pass
        out.append((layer.keys[row:row + 1, :, :upto], layer.values[row:row + 1, :, :upto]))
    return out


def cache_of(rows: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> DynamicCache:
    """A new cache of plain layers whose batch row r holds rows[r] (cached_rows' layers): the
    keys and values concatenated into new tensors, so a forward that appends to the cache
    leaves the rows as they are."""
    import torch
    from transformers import DynamicCache

    layers = len(rows[0])
    return DynamicCache([(torch.cat([r[l][0] for r in rows]), torch.cat([r[l][1] for r in rows]))
                         for l in range(layers)])


__all__ = ["cache_kwarg", "cache_kwargs", "cache_of", "cached_rows", "plain_cache"]
