"""The rendered output of run, explain, shapes and generate at 80, 120 and 200 columns equals
the golden files (regenerate them with `python tests/golden.py` and review the diff); and at
any width, no number or header is cut."""

from __future__ import annotations

import pytest

import golden


@pytest.fixture(scope="module")
def views():
    return golden.views()


@pytest.mark.parametrize("width", golden.WIDTHS)
@pytest.mark.parametrize("name", ["run", "explain", "shapes", "generate"])
def test_matches_golden_file(views, name, width):
    want = golden.path(name, width).read_text(encoding="utf-8")
    got = golden.render(views[name], width)
    assert got == want, (f"{name} at {width} columns differs from {golden.path(name, width)}; "
                         "if the change is intended, run `python tests/golden.py` and review "
                         "the diff")


@pytest.mark.parametrize("width", [60, 80, 100, 120, 200])
@pytest.mark.parametrize("name", ["run", "explain", "shapes", "generate"])
def test_nothing_is_cut(views, name, width):
    """rich marks a cut cell with '…' at its end: no table may show one, and no line is wider
    than the terminal (the text-so-far column of generate is text, cut on the left on purpose,
    and formulas may contain a literal '[…, ')."""
    import re

    cut = re.compile(r"\S…(\s|[│┃]|$)")
    text = golden.render(views[name], width)
    for line in text.splitlines():
        assert len(line) <= width, line
        assert not cut.search(line), line
