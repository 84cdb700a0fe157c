"""Hooks on every block that capture small per-layer statistics, and always come off.

What is kept per forward is O(layers x batch x (d + T)): the last position's vector of each step
and the stream's norm at each position, never the (B, T, d) streams themselves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fptrace.errors import TraceFailed
from fptrace.families.parts import ModelParts

if TYPE_CHECKING:
    import torch
    from torch import nn


def first_output(x: Any) -> Any:
    """A module's main output: the first element of a tuple (attention and blocks return
    (hidden, weights, ...)), else the output itself."""
    return x[0] if isinstance(x, (tuple, list)) else x


@dataclass(frozen=True)
class Hook:
    """One registration on a module: fn runs before it (pre: fn(module, args) sees the inputs,
    and may return new ones) or after it (fn(module, args, output) sees the output, and may
    return a new one); with kwargs, the keyword arguments are passed too (fn(module, args,
    kwargs[, output]))."""

    module: nn.Module
    fn: Callable[..., Any]
    pre: bool = False
    kwargs: bool = False

    @classmethod
    def before(cls, module: nn.Module, fn: Callable[..., Any], kwargs: bool = False) -> Hook:
        return cls(module, fn, pre=True, kwargs=kwargs)

    @classmethod
    def after(cls, module: nn.Module, fn: Callable[..., Any], kwargs: bool = False) -> Hook:
        return cls(module, fn, pre=False, kwargs=kwargs)


class StopForward(Exception):
    """Raised by a hook once a forward pass has computed all that its caller reads: the caller
    catches it around the model's call, and nothing after that point runs (the blocks after the
    last one read, the LM head)."""


@contextlib.contextmanager
def hooked(hooks: Iterable[Hook], prepend: bool = False) -> Iterator[None]:
    """The one place fptrace attaches hooks: register every Hook, yield, and remove every
    handle whatever happens (an exception while registering included).

    prepend: run these hooks before the module's other hooks. A hook that *changes* an output
    (steering, ablation) is prepended, so that every other hook sees the changed value:
    transformers fills `output_hidden_states` from a hook of its own on each block, installed
    for good by the first forward that asks for hidden states, which runs before any hook
    appended after it."""
    handles = []
    try:
        for hook in hooks:
            register = hook.module.register_forward_pre_hook if hook.pre else \
                hook.module.register_forward_hook
            handles.append(register(hook.fn, with_kwargs=hook.kwargs, prepend=prepend))
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def eager_attention(model: Any) -> Iterator[None]:
    """Run the model with transformers' eager attention inside the block, so that each
    attention module returns its weights (B, nh, T, T) as output[1]; the implementation it had
    (sdpa, flash, ...) is set back whatever happens."""
    impl = getattr(model.config, "_attn_implementation", None)
    if impl in (None, "eager"):
        yield
        return
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(impl)


@dataclass
class Capture:
    """Filled in by the hooks during one forward pass (tensors live on the model's device)."""

    mask: Any  # (B, T) bool, or None when no row is padded
    home: Any = None  # device the statistics are gathered on (blocks may live on several)
    embed_last: Any = None  # (B, d) float32
    resid_last: list = field(default_factory=list)  # per block: (B, d) float32
    # per stream (the embedding, then each block's output): (B, T) float32 ‖stream‖ at every
    # position (0 at padding), and (B, d) the stream at each row's largest, in the model's
    # dtype; summarised after the forward by norm_summary, in a few batched reductions
    norms: list = field(default_factory=list)
    peaks: list = field(default_factory=list)
    # per block: (B, d) float32 of what attention / the MLP added; None if its module never ran
    attn_last: list = field(default_factory=list)
    mlp_last: list = field(default_factory=list)
    final_last: Any = None  # (B, d) float32
    shapes: dict = field(default_factory=dict)  # label -> shape tuple
    last_block: int | None = None  # the last block whose forward finished
    keep_positions: int = 0  # > 0: also keep the last N positions of every stream (row 0)
    streams: list = field(default_factory=list)  # embed, block 0, ...: (N, d) float32 each
    # with keep_positions, per block: (N, d) float32 of what attention / the MLP added at those
    # positions (None if its module never ran)
    attn_positions: list = field(default_factory=list)
    mlp_positions: list = field(default_factory=list)

    def take_last(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, d) -> (B, d) float32 copy of the last position (rows are left-padded, so the
        last position is every row's last real token). A copy, so the stream is not kept; on
        the home device, so that blocks spread over devices give one stack."""
        import torch

        return h[:, -1].to(self.home or h.device, torch.float32, copy=True)

    def take_positions(self, h: torch.Tensor) -> torch.Tensor:
        """(B, T, d) -> (N, d) float32 copy of row 0's last N positions."""
        import torch

        return h[0, -self.keep_positions:].to(self.home or h.device, torch.float32, copy=True)

    def keep_norms(self, k: int, h: torch.Tensor) -> None:
        """Stream k's share of the norm statistics (k = 0: the embedding; k = i + 1: block i's
        output): ‖h‖ at every position, and the row of h at each batch row's largest. A few
        small kernels during the forward; norm_summary makes the rest for every stream at
        once (on a GPU each launch costs the host about as much as the kernel costs the GPU)."""
        import torch

        norms = torch.linalg.vector_norm(h, dim=-1, dtype=torch.float32)  # (B, T)
        if self.mask is not None:
            norms = torch.where(self.mask.to(h.device), norms, torch.zeros_like(norms))
        first = norms.argmax(dim=-1)  # (B,) the first position of the largest
        home = self.home or h.device
        for kept in (self.norms, self.peaks):
            kept.extend([None] * (k + 1 - len(kept)))
        self.norms[k] = norms.to(home)
        self.peaks[k] = torch.take_along_dim(h, first[:, None, None], dim=1)[:, 0].to(home)

    def norm_summary(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Over every stream kept by keep_norms: (S, B) the mean of ‖stream‖ over the real
        positions, and (S, B, 4) its largest value, the position (counted from the row's first
        real token), and at that position the channel of the largest |value| and that value."""
        import torch

        norms = torch.stack(self.norms)  # (S, B, T); padded positions hold 0
        top, first = norms.max(dim=-1)  # (S, B)
        if self.mask is None:
            mean, where = norms.mean(dim=-1), first
        else:
            m = self.mask.to(norms.device)
            mean = norms.sum(dim=-1) / m.sum(dim=-1).clamp(min=1)
            where = first - (~m).sum(dim=-1)  # left padding: positions from the first real token
        rows = torch.stack(self.peaks).float()  # (S, B, d)
        channel = rows.abs().argmax(dim=-1)  # (S, B)
        value = rows.gather(-1, channel[..., None])[..., 0]
        return mean, torch.stack([top, where.float(), channel.float(), value], -1)


def is_oom(e: BaseException) -> bool:
    """torch's OutOfMemoryError (CUDA, MPS), a CPU allocation failure, or Python's MemoryError."""
    return isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or (
        isinstance(e, RuntimeError) and ("out of memory" in str(e).lower()
                                         or "failed to allocate" in str(e).lower()))


@contextlib.contextmanager
def capture_stats(parts: ModelParts, cap: Capture) -> Iterator[Capture]:
    """Register the hooks, yield, and remove every handle whatever happens.

    An exception inside the forward is re-raised as TraceFailed naming the last block that ran.
    """
    n = len(parts.blocks)
    cap.resid_last = [None] * n
    cap.norms = [None] * (n + 1)
    cap.peaks = [None] * (n + 1)
    cap.attn_last = [None] * n
    cap.mlp_last = [None] * n
    cap.streams = [None] * (n + 1) if cap.keep_positions else []
    cap.attn_positions = [None] * n if cap.keep_positions else []
    cap.mlp_positions = [None] * n if cap.keep_positions else []

    def embed_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        h = args[0] if args else kwargs["hidden_states"]
        cap.embed_last = cap.take_last(h)
        cap.keep_norms(0, h)
        if cap.keep_positions:
            cap.streams[0] = cap.take_positions(h)
        cap.shapes["embed"] = tuple(h.shape)

    def block_hook(i: int):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            h = first_output(output)
            cap.resid_last[i] = cap.take_last(h)
            cap.keep_norms(i + 1, h)
            if cap.keep_positions:
                cap.streams[i + 1] = cap.take_positions(h)
            cap.shapes[f"block {i}"] = tuple(h.shape)
            cap.last_block = i
        return hook

    def part_hook(store: list, kept: list, i: int):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            h = first_output(output)
            store[i] = cap.take_last(h)
            if cap.keep_positions:
                kept[i] = cap.take_positions(h)
        return hook

    def final_hook(module: nn.Module, args: tuple, output: Any) -> None:
        h = first_output(output)
        cap.final_last = cap.take_last(h)
        cap.shapes["final_norm"] = tuple(h.shape)

    hooks: list[Hook] = [Hook.before(parts.blocks[0], embed_hook, kwargs=True)]
    for i, block in enumerate(parts.blocks):
        hooks.append(Hook.after(block, block_hook(i), kwargs=True))
        # what the stream receives: the post-norm output where the family has one
        hooks.append(Hook.after(parts.attn_adds[i],
                                part_hook(cap.attn_last, cap.attn_positions, i)))
        hooks.append(Hook.after(parts.mlp_adds[i], part_hook(cap.mlp_last, cap.mlp_positions, i)))
    hooks.append(Hook.after(parts.final_norm, final_hook))
    with hooked(hooks):
        try:
            yield cap
        except TraceFailed:
            raise
        except Exception as e:
            if is_oom(e):
                raise  # the caller knows the sizes to name
            if not isinstance(e, (RuntimeError, ValueError, IndexError, TypeError)):
                raise
            where = "the embedding" if cap.last_block is None else f"block {cap.last_block}"
            nxt = "block 0" if cap.last_block is None else f"block {cap.last_block + 1}"
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TraceFailed(f"the forward pass failed after {where} (in or after {nxt}): "
                              f"{type(e).__name__}: {msg}"[:400]) from e
