"""How much memory a device has, and a clear error before a load that cannot fit."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from fptrace.errors import BadInput, param

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def available_bytes(device: Any) -> int | None:
    """Free memory on `device` (a torch.device), or None when unknown."""
    if device.type == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    return None


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def check_fits(needed: int, device: Any, what: str) -> None:
    free = available_bytes(device)
    if free is not None and needed > 0.9 * free:
        raise BadInput(
            f"{what} need {human_bytes(needed)} on {device} but only {human_bytes(free)} is free; "
            f"try {param('dtype')} bfloat16, {param('device_map')} auto (spreads blocks over "
            f"GPUs, CPU and disk), "
            "a smaller model, or `fptrace shapes` (no weights needed)")


def forward_bytes(config: PretrainedConfig, batch: int, seq_len: int, logits_positions: int,
                  dtype_bytes: int) -> int:
    """A rough peak of one forward pass's activations: the few (B, T, d)-sized tensors alive in
    a block, the MLP's hidden layer, one layer's attention scores, and the logits (float32)."""
    from fptrace.families.parts import dims

    dm = dims(config)
    d, heads, vocab = dm.d_model, dm.n_heads, dm.vocab_size
    d_mlp = dm.d_mlp or 4 * d  # an estimate: a config that does not say is taken as 4·d
    per_block = batch * seq_len * (6 * d + 3 * d_mlp) + batch * heads * seq_len * seq_len
    return per_block * dtype_bytes + batch * logits_positions * vocab * 4


def check_forward_fits(config: PretrainedConfig, device: Any, dtype_bytes: int, batch: int,
                       seq_len: int, what: str, lower: str, extra_bytes: int = 0) -> None:
    """Refuse, before it runs, a batched forward whose activations (plus `extra_bytes` the
    caller keeps) would not fit in 80% of the free memory: `what` names the batch, `lower` what
    to change ("lower --batch-size")."""
    check_held_fits(forward_bytes(config, batch, seq_len, 1, dtype_bytes) + extra_bytes, device,
                    what, lower)


def check_held_fits(need: int, device: object, what: str, lower: str) -> None:
    """Refuse, before it is made, what would hold `need` bytes beyond 80% of the free memory:
    `what` names it, `lower` what to change."""
    free = available_bytes(device)
    if free is not None and need > 0.8 * free:
        raise BadInput(f"{what} needs about {human_bytes(need)} but {human_bytes(free)} is free "
                       f"on {device}; {lower}")


def out_of_memory(config: PretrainedConfig, device: Any, batch: int, seq_len: int,
                  logits_positions: int, dtype_bytes: int) -> str:
    need = forward_bytes(config, batch, seq_len, logits_positions, dtype_bytes)
    free = available_bytes(device)
    have = f", {human_bytes(free)} free" if free is not None else ""
    return (f"out of memory on {device} in the forward pass over {batch} × {seq_len} tokens "
            f"(it needs roughly {human_bytes(need)} of activations{have}); try a shorter prompt, "
            "a smaller --batch-size, --dtype bfloat16, --device-map auto"
            + (", or leave out --all-positions" if logits_positions > 1 else ""))
