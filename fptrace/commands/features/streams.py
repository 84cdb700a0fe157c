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
from fptrace.core.hooks import Hook, first_output, hooked
from fptrace.points import Point

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch import nn

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


def _hidden(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def hooks_for(lm: LoadedModel, cap: Captured, streams: Iterable[int], sites: Iterable[Site],
              attribution: bool = False) -> list[Hook]:
    """Hooks that fill `cap` with the given stream numbers and MLP sites; with attribution, the
    final stream and the LM head's output at the last position too."""
    parts = lm.parts
    n = len(parts.blocks)
    hooks: list[Hook] = []

    def pre(store: dict, key: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            store[key] = _copy(_hidden(args, kwargs))
        return hook

    def post(store: dict, key: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            store[key] = _copy(first_output(output))
        return hook

    for i in sorted(set(streams)):
        if i == 0:
            hooks.append(Hook.before(parts.blocks[0], pre(cap.streams, 0), kwargs=True))
        else:
            hooks.append(Hook.after(parts.blocks[i - 1], post(cap.streams, i), kwargs=True))
    for s in set(sites):
        if s.point is MLP_IN:
            hooks.append(Hook.before(parts.mlps[s.layer], pre(cap.mlp_in, s.layer), kwargs=True))
        elif s.point is Point.mlp_out:
            hooks.append(Hook.after(parts.mlp_adds[s.layer], post(cap.mlp_out, s.layer),
                                    kwargs=True))
    if attribution:
        def final(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            cap.final_last = _copy(first_output(output)[:, -1])

        def head(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            cap.logits_last = _copy(first_output(output)[:, -1])

        hooks.append(Hook.after(parts.blocks[n - 1], final, kwargs=True))
        hooks.append(Hook.after(parts.lm_head, head, kwargs=True))
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


__all__ = ["Captured", "capture", "hooks_for", "stream_index"]
