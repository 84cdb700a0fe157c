"""The model's own KV cache, the way fptrace passes it: transformers 5 renamed the forward's
`past_key_values` parameter to `cache`; `cache_kwarg` reads which one the forward takes.
`plain_cache` is a fresh cache of the model's own layout where every layer is a plain growing
cache (keys and values of every earlier position, appended to by each forward), the layout whose
rows a caller may copy and extend: None where a layer keeps less or something else (a sliding
window, linear attention, keys shared across layers) or the forward takes no cache."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from fptrace.models.loading import LoadedModel


def cache_kwarg(model: nn.Module) -> str | None:
    """The name of the forward's cache parameter (`cache`, `past_key_values`), or None."""
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


def plain_cache(lm: LoadedModel) -> Any | None:
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


__all__ = ["cache_kwarg", "plain_cache"]
