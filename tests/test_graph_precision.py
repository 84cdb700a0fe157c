"""`fptrace graph --precision float32`: the rows (and the split over heads) computed on a
float32 copy of the model keep every check at float64's tolerances, on a Llama-like and a
GPT-2-like model, over neurons and over transcoders, and on two mixtures of experts: every
computed node's edges plus its bias terms equal the real model's value (hooks on its own
modules), the edges equal the float64 graph's within 1e-4 of their row's largest; a float32 row
that misses its value, or a split that misses its float32 edge, is recomputed in float64 and
counted; bad inputs."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from conftest import build_tiny, real_neurons
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.graph import core as graph_core
from fptrace.commands.graph.core import graph
from fptrace.commands.graph.examples import write_transcoders
from fptrace.commands.graph.rows import Rows
from fptrace.errors import BadInput
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 9, 311]
FAMILIES = ("llama", "gpt2")
ALL = {"node_threshold": 1.0, "edge_threshold": 1.0}  # every node and edge kept
runner = CliRunner()


def _lm(family):
    return wrap_model(build_tiny(family), name=f"tiny-{family}", random_weights=True)


def _graph(monkeypatch, lm, **kw):
    """graph(lm, IDS, **kw) and what it assembled: each computed node's Rows by target, and
    its row of the candidate-level matrix by node (core._assemble's arguments)."""
    got: dict = {}
    assemble = graph_core._assemble

    def spy(*a, **k):
        got["done"] = {t: r for t, r, _ in a[5]}
        got["matrix"] = dict(zip(a[6].nodes.tolist(), a[6].rows.copy(), strict=True))
        return assemble(*a, **k)

    monkeypatch.setattr(graph_core, "_assemble", spy)
    g = graph(lm, IDS, **kw)
    monkeypatch.setattr(graph_core, "_assemble", assemble)
    return g, got


def _note(g):
    return next(n for n in g.notes if "float32" in n)


def _same_edges(a, b, g32, g64):
    """The float32 graph's edges (every computed row, before pruning) equal the float64
    graph's within 1e-4 of their row's largest; so do the edges both keep."""
    assert a["matrix"].keys() == b["matrix"].keys()
    worst = max(float(np.abs(a["matrix"][n] - row).max() / np.abs(row).max())
                for n, row in b["matrix"].items())
    assert worst <= 1e-4, worst
    kept64 = {(e.source, e.target): e.weight for e in g64.edges}
    largest: dict[str, float] = {}
    for (_, t), w in kept64.items():
        largest[t] = max(largest.get(t, 0.0), abs(w))
    both = [(e, kept64[(e.source, e.target)]) for e in g32.edges
            if (e.source, e.target) in kept64]
    assert len(both) >= 0.99 * len(kept64)
    assert max(abs(e.weight - w) / largest[e.target] for e, w in both) <= 1e-4
    return worst


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_rows_keep_every_check_and_the_float64_edges(family, monkeypatch):
    lm = _lm(family)
    g64, b = _graph(monkeypatch, lm, max_nodes=12, per_site=3, **ALL)
    g32, a = _graph(monkeypatch, lm, max_nodes=12, per_site=3, precision="float32", **ALL)
    assert g32.ok and g32.precision == "float32" and g64.precision == "float64"
    assert [c.name for c in g32.checks] == ["graph_sums", "graph_model", "graph_heads"]
    assert all(c.value <= 1e-5 for c in g32.checks)
    assert g32.checks[0].value > 1e-9  # float32 rounding, not float64's: the rows are float32
    assert g32.computed == 12 and f"of the {len(a['done'])} rows" in _note(g32)
    _same_edges(a, b, g32, g64)
    # each computed node: its edges plus its bias terms are the real model's value
    acts, logits = real_neurons(lm, IDS)
    for t, r in a["done"].items():
        real = logits[t.index] if t.layer is None else acts[t.layer][t.position, t.index]
        assert float(r.total[0]) == pytest.approx(float(real), rel=1e-4, abs=1e-5), t


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_rows_over_transcoders(family, tmp_path, monkeypatch):
    lm = _lm(family)
    L, d = lm.config.num_hidden_layers, lm.config.hidden_size
    folder = write_transcoders(str(tmp_path / "tc"), range(L), d, 48, k=8)
    g64, b = _graph(monkeypatch, lm, transcoders=folder, max_nodes=16, per_site=3, **ALL)
    g32, a = _graph(monkeypatch, lm, transcoders=folder, max_nodes=16, per_site=3,
                    precision="float32", **ALL)
    assert g32.ok and all(c.value <= 1e-5 for c in g32.checks), g32.checks
    assert any(n.node_type == "error" for n in g32.nodes)
    _same_edges(a, b, g32, g64)


@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_float32_rows_of_mixtures_of_experts(family, monkeypatch):
    """The float32 passes recompute each MoE block from its experts as the float64 ones do
    (checked against the module's own output at float32's tolerance there)."""
    lm = _lm(family)
    g64, b = _graph(monkeypatch, lm, max_nodes=12, per_site=3, **ALL)
    g32, a = _graph(monkeypatch, lm, max_nodes=12, per_site=3, precision="float32", **ALL)
    assert g32.ok and all(c.value <= 1e-5 for c in g32.checks), g32.checks
    _same_edges(a, b, g32, g64)


def test_a_float32_row_that_misses_is_recomputed_in_float64(monkeypatch):
    """Every float32 row of one batch made to miss its value (a bias term off by 1): each is
    recomputed in float64, the graph holds, and the note counts them."""
    lm = _lm("llama")
    g64, b = _graph(monkeypatch, lm, max_nodes=12, per_site=3, **ALL)
    rows = graph_core.rows
    spoiled: list[int] = []

    def spoil(p, targets, cand):
        r = rows(p, targets, cand)
        if p.embed.dtype == torch.float32 and not spoiled:
            spoiled.append(len(targets))
            return Rows(tokens=r.tokens, chosen=r.chosen, sites=r.sites, errors=r.errors,
                        bias=r.bias + 1.0)
        return r

    monkeypatch.setattr(graph_core, "rows", spoil)
    g32, a = _graph(monkeypatch, lm, max_nodes=12, per_site=3, precision="float32", **ALL)
    assert spoiled and g32.ok and g32.checks[0].value <= 1e-5
    # the spoiled batch's rows at least (a row that misses by rounding on another CPU's
    # kernels would be counted too)
    counted = re.search(r"recomputed in float64: (\d+) of the (\d+) rows", _note(g32))
    assert counted and int(counted[2]) == len(a["done"])
    assert spoiled[0] <= int(counted[1]) < int(counted[2])
    _same_edges(a, b, g32, g64)


def test_a_split_that_misses_its_float32_edge_is_redone_in_float64(monkeypatch):
    """The float32 split of every edge into one target made to miss (its direct part off by
    1): that target's row and its edges' splits are recomputed in float64, graph_heads holds,
    its edges are the float64 graph's, and the note counts it (with the splits that miss in
    float32 on their own: a few on this model)."""
    lm = _lm("gpt2")
    g64, b = _graph(monkeypatch, lm, max_nodes=12, per_site=3, **ALL)
    split = graph_core.split
    spoiled: list = []

    def spoil(p, targets, srcs, L, vecs):
        got = split(p, targets, srcs, L, vecs)
        if p.embed.dtype == torch.float32 and not spoiled:
            spoiled.append(targets[0])
            got.direct[np.array([b for b, _ in srcs]) == 0] += 1.0
        return got

    monkeypatch.setattr(graph_core, "split", spoil)
    g32, a = _graph(monkeypatch, lm, max_nodes=12, per_site=3, precision="float32", **ALL)
    assert spoiled and g32.ok
    heads = next(c for c in g32.checks if c.name == "graph_heads")
    assert heads.value <= 1e-5
    k = int(re.search(r"and (\d+) more for the split over heads", _note(g32)).group(1))
    assert 1 <= k <= len(a["done"])
    t = spoiled[0]
    L = lm.config.num_hidden_layers
    target = f"{L + 1}_{t.index}_{len(IDS) - 1}" if t.layer is None else \
        f"{t.layer}_{t.index}_{t.position}"
    by64 = {(e.source, e.target): e.weight for e in g64.edges}
    redone = [(e.weight, by64[(e.source, e.target)]) for e in g32.edges if e.target == target]
    assert redone  # the recomputed row's edges: the float64 graph's own
    for w32, w64 in redone:
        assert w32 == pytest.approx(w64, rel=1e-9, abs=1e-12)
    _same_edges(a, b, g32, g64)


@pytest.mark.parametrize("args, says", [
    (["--precision", "float16"], "--precision 'float16': give float64 or float32"),
    (["--precision", "float32", "--verify", "2"], "--verify and --qk"),
    (["--precision", "float32", "--qk", "1"], "--verify and --qk"),
])
def test_bad_precision_exits_2_with_one_line(args, says):
    got = runner.invoke(app, ["graph", "hi", "--neurons", *args])
    assert got.exit_code == 2, got.output
    assert says in got.output and len(got.output.strip().splitlines()) == 1, got.output


def test_the_api_names_precision():
    lm = _lm("llama")
    with pytest.raises(BadInput, match="precision 'half'"):
        graph(lm, IDS, precision="half")
    with pytest.raises(BadInput, match="verify and qk"):
        graph(lm, IDS, precision="float32", verify=1)
