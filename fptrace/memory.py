"""How much memory a device has, and a clear error before a load that cannot fit."""

from __future__ import annotations

import os
from typing import Any

from .errors import BadInput


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
            "try --dtype bfloat16, --device-map auto (spreads blocks over GPUs, CPU and disk), "
            "a smaller model, or `fptrace shapes` (no weights needed)")
