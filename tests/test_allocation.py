"""fptrace/allocation.py: the `fptrace` command turns numpy's huge-page advice off before numpy
is imported (unless the environment says otherwise); a program that imports fptrace keeps
numpy's own setting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fptrace import allocation

KEY = "NUMPY_MADVISE_HUGEPAGE"


@pytest.mark.parametrize(("cli", "before", "after"), [
    (True, None, "0"),  # the command: off
    (True, "1", "1"),  # the user's own setting kept
    (False, None, None),  # a program importing fptrace: untouched
])
def test_the_command_sets_numpys_huge_pages_off_unless_told(monkeypatch, cli, before, after):
    monkeypatch.setattr(allocation, "is_cli", lambda: cli)
    if before is None:
        monkeypatch.delenv(KEY, raising=False)
    else:
        monkeypatch.setenv(KEY, before)
    allocation.starting()
    assert os.environ.get(KEY) == after


PROBE = """
import sys
if sys.argv[1] == "command":
    sys.argv[0] = "fptrace"  # what the console script's process looks like (interrupt.is_cli)
import fptrace
import numpy
print(numpy._core.multiarray._get_madvise_hugepage())
"""


@pytest.mark.system
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="numpy advises on Linux only")
def test_numpy_in_the_command_gives_no_huge_page_advice():
    """In a fresh process: as the `fptrace` command, numpy (imported after fptrace) gives no
    huge-page advice; as a program importing fptrace, numpy keeps its default (advice on, on a
    Linux kernel of 4.6 or later)."""
    env = {k: v for k, v in os.environ.items() if k != KEY}
    got = {}
    for role in ("command", "library"):
        done = subprocess.run([sys.executable, "-c", PROBE, role], capture_output=True,
                              text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        got[role] = done.stdout.strip().splitlines()[-1]
    try:  # numpy's own rule: advice on from kernel 4.6, off where the version does not parse
        advised = tuple(int(x) for x in os.uname().release.split(".")[:2]) >= (4, 6)
    except ValueError:
        advised = False
    assert got == {"command": "False", "library": str(advised)}
