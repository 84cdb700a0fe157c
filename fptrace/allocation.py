"""How the `fptrace` command's process allocates large arrays: numpy's transparent huge pages off.

numpy advises the kernel to back every array of 4 MB or more with transparent huge pages
(madvise). Where the kernel then compacts memory to find them at the array's first touch
(`/sys/kernel/mm/transparent_hugepage/defrag` set to `madvise`, a common default), a large
new array can cost far more to fill than its arithmetic: on the 2-core machine these figures come
from, filling a new 268 MB array took 1.5–1.6 s with the advice and 0.1 s without, and a graph
over 5,309 transcoder rows (hundreds of MB of rows and their copies) 21.5 s against 18.4 s in
float32, 30.6 s against 29.0 s in float64, with the same figures (benchmarks/README.md).
numpy reads its setting once, when it is imported, from `NUMPY_MADVISE_HUGEPAGE`; the command
sets it to 0 before anything imports numpy, unless the user's environment sets it. A program
that imports fptrace keeps numpy as it has it.
"""

from __future__ import annotations

import os

from fptrace.interrupt import is_cli


def starting() -> None:
    """At the very start of the `fptrace` command (never a program that imports fptrace):
    numpy's huge-page advice off, where the environment does not say otherwise."""
    if is_cli():
        os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")


__all__ = ["starting"]
