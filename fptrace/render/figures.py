"""Figures (matplotlib, headless): the figure functions return the Figure and the exact series
they plotted, so tests can check that every plotted number comes from the result."""

from __future__ import annotations

import math
import os
from typing import Any

from fptrace.errors import BadInput


def nan_if_none(x: float | None) -> float:
    return math.nan if x is None else x


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    return plt


def check_path(path: str, what: str = "--plot", force: bool = False) -> str:
    """The format named by the extension, or one clear error (before any work is done); an
    existing file that fptrace did not write needs force (atomic.check_target)."""
    from fptrace.atomic import check_target

    check_target(path, what, "trace.png", force)
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    formats = ("png", "svg", "pdf", "jpg", "jpeg", "webp")
    if ext not in formats:
        raise BadInput(f"{what} {path}: the extension does not name an image format; use "
                       + ", ".join("." + f for f in formats))
    return ext


def save(fig: Any, path: str, force: bool = False) -> None:
    """Write the figure atomically (see atomic.py): a failure never leaves half a file. PNG,
    SVG and PDF carry fptrace's name in their metadata, so that a later --plot to the same
    path knows the file as its own."""
    from fptrace.atomic import MARK, write_atomic

    ext = check_path(path, force=force)
    meta = {"png": {"Software": MARK}, "svg": {"Creator": MARK},
            "pdf": {"Creator": MARK}}.get(ext)
    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp, format=ext, dpi=110,
                                                   bbox_inches="tight", metadata=meta),
                     "." + ext)
    finally:
        pyplot().close(fig)


