"""The tensors a dictionary reads, every position, from one forward pass through the one hook
site (core/hooks.py): the stream between blocks, the MLP's input and what the MLP added.

The stream between blocks is numbered as transformers' hidden states are: 0 is the embedding
(the input of block 0), i is the output of block i − 1 (the input of block i).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fptrace.addresses import Site
from fptrace.core.dictionary_sites import MLP_IN
from fptrace.core.hooks import Hook, hooked
from fptrace.core.taps import hooks_at, received, tap_hook
from fptrace.families import Tap
from fptrace.points import Point

if TYPE_CHECKING:
    import torch

    from fptrace.models.loading import LoadedModel


def stream_index(site: Site) -> int | None:
    """The stream's number for a resid site, None for the MLP's points."""
    if site.point is Point.resid_pre:
        return site.layer
    if site.point is Point.resid_post:
        return site.layer + 1
    return None


@dataclass
class Captured:
    """Filled during one pass: (B, T, d) float32 tensors on the model's device."""

    streams: dict = field(default_factory=dict)  # stream index -> (B, T, d)
    mlp_in: dict = field(default_factory=dict)  # block -> (B, T, d)
    mlp_out: dict = field(default_factory=dict)  # block -> (B, T, d)
    final_last: Any = None  # (B, d) the stream entering the final norm, last position
    logits_last: Any = None  # (B, V) the LM head's output before any softcap, last position

    def at(self, site: Site) -> torch.Tensor:
        i = stream_index(site)
        if i is not None:
            return self.streams[i]
        return (self.mlp_in if site.point is MLP_IN else self.mlp_out)[site.layer]


def _copy(h: torch.Tensor) -> torch.Tensor:
    import torch

    return h.detach().to(torch.float32, copy=True)


def stream_site(i: int) -> Site:
    """Stream i's place: the input of block 0 for the embedding, else block i − 1's output."""
    return Site(0, Point.resid_pre) if i == 0 else Site(i - 1, Point.resid_post)


def hooks_for(lm: LoadedModel, cap: Captured, streams: Iterable[int], sites: Iterable[Site],
              attribution: bool = False) -> list[Hook]:
    """Hooks that fill `cap` with the given stream numbers and MLP sites; with attribution, the
    final stream and the LM head's output at the last position too."""
    parts = lm.parts
    n = len(parts.blocks)
    places: dict[Site, tuple[dict, int]] = {}  # where the model shows it -> where it is kept
    for i in sorted(set(streams)):
        places[stream_site(i)] = (cap.streams, i)
    for s in set(sites):
        if s.point is MLP_IN:
            places[Site(s.layer, MLP_IN)] = (cap.mlp_in, s.layer)
        elif s.point is Point.mlp_out:  # what the stream receives from the MLP
            places[received(lm, s.layer, "mlp")] = (cap.mlp_out, s.layer)

    def keep(site: Site, x: torch.Tensor | None) -> None:
        assert x is not None  # a stream and the MLP's tensors are always there
        store, key = places[site]
        store[key] = _copy(x)

    hooks = hooks_at(lm, places, keep)
    if attribution:
        def final(site: Site, x: torch.Tensor | None) -> None:
            assert x is not None
            cap.final_last = _copy(x[:, -1])

        def head(x: torch.Tensor | None) -> None:
            assert x is not None
            cap.logits_last = _copy(x[:, -1])

        hooks += hooks_at(lm, [Site(n - 1, Point.resid_post)], final)
        hooks.append(tap_hook(parts.lm_head, Tap(""), head))
    return hooks


def capture(lm: LoadedModel, input_ids: torch.Tensor, streams: Iterable[int],
            sites: Iterable[Site], attribution: bool = False, **kwargs: object) -> Captured:
    """One forward pass of input_ids (B, T) with the hooks of hooks_for; the model's own
    last-position logits are not needed beyond the LM head's hook."""
    import torch

    cap = Captured()
    with torch.inference_mode(), hooked(hooks_for(lm, cap, streams, sites, attribution)):
        lm.model(input_ids, **{"use_cache": False, "logits_to_keep": 1, **kwargs})
    return cap


__all__ = ["Captured", "capture", "hooks_for", "stream_index", "stream_site"]
