"""The views the golden files hold: every command's terminal output, rendered at 80, 120 and
200 columns, on a seeded tiny GPT-2 (the real GPT-2 tokenizer, random weights) and on the gpt2
config (shapes, meta device): a layout change shows as a reviewed diff.

tests/test_golden.py renders each view and compares it with tests/golden/<view>-<width>.txt
through the `golden` fixture (conftest.py); `pytest tests/test_golden.py --update-golden`
rewrites them. A command's views are declared in its folder (VIEWS in
fptrace/commands/<name>/examples.py); this module collects them.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).parent
WIDTHS = (80, 120, 200)


def _model():
    sys.path.insert(0, str(HERE))
    from conftest import tiny_gpt2

    from fptrace.models.loading import load_model

    return load_model(tiny_gpt2(), random_weights=True, seed=0, device="cpu")


class Bench:
    """What a view borrows from the tests (fptrace/examples.py)."""

    def tiny(self, family: str) -> Any:
        sys.path.insert(0, str(HERE))
        from conftest import build_tiny

        return build_tiny(family)

    def lm(self, family: str, random_weights: bool = True) -> Any:
        from fptrace.models.loading import wrap_model

        return wrap_model(self.tiny(family), name=f"tiny-{family}",
                          random_weights=random_weights)

    def gpt2_folder(self) -> str:
        sys.path.insert(0, str(HERE))
        from conftest import tiny_gpt2

        return tiny_gpt2()

    def tmp(self, name: str) -> Path:
        import tempfile

        return Path(tempfile.mkdtemp(prefix=f"fptrace-{name}-"))


def collect() -> dict[str, Callable]:
    """name -> make(lm, bench) of every view the command folders declare (examples.py VIEWS)."""
    from fptrace.extensions import declared

    out: dict[str, Callable] = {}
    for command, views in declared("examples", "VIEWS"):
        for view in views:
            assert view.name not in out, f"two golden views named {view.name!r} ({command})"
            out[view.name] = view.make
    return out


VIEWS = collect()


def views() -> dict[str, Callable]:
    """name -> a function of the width that returns the renderable."""
    lm, bench = _model(), Bench()
    return {name: make(lm, bench) for name, make in VIEWS.items()}


def render(view: Callable, width: int) -> str:
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False,
                      highlight=False)
    console.print(view(width), soft_wrap=False)
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines()) + "\n"
