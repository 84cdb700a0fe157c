"""The attribution graph on the page (`fptrace report --graph`, `fptrace graph --html`): the
blocks × positions map holds every kept node of the graph's own JSON (its influence summed in
its cell, its edges in its hover), a hover in Chromium shows them, and the options' mistakes
are one line before anything is loaded."""

from __future__ import annotations

import json

import pytest
from conftest import hover_heatmap_cell, page_heatmap, tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app

PROMPT = "The cat sat on the"
runner = CliRunner()


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """(the page `fptrace graph --html` wrote, the graph's own --json of the same run)."""
    out = tmp_path_factory.mktemp("page") / "g.html"
    r = runner.invoke(app, ["graph", PROMPT, "-m", tiny_gpt2(), "--neurons", "--max-nodes", "8",
                            "--node-threshold", "1", "--edge-threshold", "1", "--html", str(out),
                            "--json"])
    assert r.exit_code == 0, r.output
    return out, json.loads(r.stdout)


def _map(out):
    return page_heatmap(out, "Attribution graph")


def test_the_map_holds_every_kept_node_and_its_edges(page):
    out, g = page
    grid = _map(out)
    L, T = g["model"]["n_layers"], len(g["tokens"])
    assert grid["rows"] == [f"block {b}" for b in range(L)] and len(grid["columns"]) == T
    placed = [n for n in g["nodes"] if n["layer"] is not None]
    assert any(n["node_type"] == "neuron" for n in placed)
    for b in range(L):
        for p in range(T):
            here = [n for n in placed if (n["layer"], n["position"]) == (b, p)]
            neurons = sum(n["node_type"] == "neuron" for n in here)
            assert grid["labels"][b][p] == (str(neurons) if neurons else "·")
            if not here:
                assert grid["values"][b][p] is None
                continue
            assert grid["values"][b][p] == pytest.approx(sum(n["influence"] for n in here))
            for n in here:
                assert n["label"].replace(" @", "@") in grid["tips"][b][p]
    strongest = max(g["edges"], key=lambda e: abs(e["weight"]))
    target = next(n for n in placed if n["node_id"] == strongest["target"]) if any(
        n["node_id"] == strongest["target"] for n in placed) else None
    if target is not None:  # the strongest edge shows in its target's hover, weight and all
        tip = grid["tips"][target["layer"]][target["position"]]
        assert f"{strongest['weight']:+.4g}" in tip


def test_hovering_a_cell_in_chromium_shows_its_nodes(page):
    out, g = page
    n = max((n for n in g["nodes"] if n["node_type"] == "neuron"), key=lambda n: n["influence"])
    _, tip = hover_heatmap_cell(out, "Attribution graph", n["layer"], n["position"])
    assert n["label"].replace(" @", "@") in tip and f"influence {n['influence']:.4f}" in tip


def test_report_takes_the_graph_and_its_mistakes_are_one_line(tmp_path):
    out = tmp_path / "r.html"
    r = runner.invoke(app, ["report", PROMPT, "-m", tiny_gpt2(), "--random-weights", "-o",
                            str(out), "--graph-transcoders", str(tmp_path)])
    assert r.exit_code == 2 and "--graph-transcoders goes with --graph" in r.stderr
    r = runner.invoke(app, ["report", PROMPT, "-m", tiny_gpt2(), "--random-weights", "-o",
                            str(out), "--graph", "--graph-transcoders", str(tmp_path / "gone")])
    assert r.exit_code == 2 and "no such folder" in r.stderr and not out.exists()
    r = runner.invoke(app, ["report", PROMPT, "-m", tiny_gpt2(), "--random-weights", "-o",
                            str(out), "--graph"])
    assert r.exit_code == 0, r.output
    assert "How the answer was computed: the attribution graph" in out.read_text()
    assert _map(out)["rows"][0] == "block 0"
