"""Every command's rendered output at 80, 120 and 200 columns equals its golden file
(`pytest tests/test_golden.py --update-golden` rewrites them; review the diff); and at any
width, no number or header is cut."""

from __future__ import annotations

import golden as views_module
import pytest


@pytest.fixture(scope="module")
def views():
    return views_module.views()


@pytest.mark.parametrize("width", views_module.WIDTHS, ids=str)
@pytest.mark.parametrize("name", list(views_module.VIEWS))
def test_view(views, name, width, golden):
    golden(views_module.render(views[name], width))


@pytest.mark.parametrize("width", [60, 80, 100, 120, 200])
@pytest.mark.parametrize("name", list(views_module.VIEWS))
def test_nothing_is_cut(views, name, width):
    """rich marks a cut cell with '…' at its end: no table may show one, and no line is wider
    than the terminal (the text-so-far column of generate is text, cut on the left on purpose,
    and formulas may contain a literal '[…, ')."""
    import re

    cut = re.compile(r"\S…(\s|[│┃]|$)")
    text = views_module.render(views[name], width)
    for line in text.splitlines():
        assert len(line) <= width, line
        assert not cut.search(line), line
