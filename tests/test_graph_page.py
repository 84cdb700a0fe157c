"""The attribution graph on the page (`fptrace report --graph`, `fptrace graph --html`): the
blocks × positions map holds every kept node of the graph's own JSON (its influence summed in
its cell, its edges in its hover), a hover in Chromium shows them; the node-link drawing holds
every kept node and edge, a hover highlights exactly a node's edges and a click shows its
activations, which are the real model's (a hook on its MLP's down projection; a transcoder's
encoder by hand on the MLP's input), and its effect on the logits; at a site of over 200 nodes
no two circles overlap, a "+N more" marker opens the weaker ones and every node is still hovered,
and the ten logits' labels do not intersect; the options' mistakes are one line before anything
is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import chromium_page, hover_heatmap_cell, page_heatmap, tiny_gpt2
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


def _drawing(out):
    """The drawing's data, as the page's script reads it (the JSON the page embeds)."""
    import re

    html = out.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="fptrace-data">(.*?)</script>', html,
                  re.S)
    data = json.loads(m.group(1))
    return next(s for s in data["sections"] if s["title"] == "Attribution graph")["graphs"][0]


def _gpt2_mlp(folder, ids, where):
    """Each block's MLP activations (the input of its down projection, mlp.c_proj: `down`) or
    its MLP's input (`in`), (T, ·) float64, read by hooks on the real float32 GPT-2's own
    modules, loaded here by transformers."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(folder).eval()
    got, handles = {}, []
    for i, block in enumerate(model.transformer.h):
        module = block.mlp.c_proj if where == "down" else block.mlp
        handles.append(module.register_forward_pre_hook(
            lambda m, a, i=i: got.__setitem__(i, a[0][0].double())))
    try:
        with torch.inference_mode():
            model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return got


def test_the_activations_are_the_real_models_mlp_activations(page):
    """Each kept neuron's activation at every position equals the real model's MLP activation
    there (the same neuron of the same block), read by a hook on the down projection's input;
    other nodes have none."""
    _, g = page
    acts = _gpt2_mlp(tiny_gpt2(), [t["id"] for t in g["tokens"]], "down")
    T = len(g["tokens"])
    neurons = [n for n in g["nodes"] if n["node_type"] == "neuron"]
    assert neurons
    for n in neurons:
        want = acts[n["layer"]][:, n["index"]].tolist()
        assert len(n["activations"]) == T
        assert n["activations"] == pytest.approx(want, rel=1e-4, abs=1e-6)
        assert n["activations"][n["position"]] == n["value"]
    assert all(n["activations"] is None for n in g["nodes"] if n["node_type"] != "neuron")


def test_a_latents_activations_are_its_encoder_on_the_real_mlp_input(tmp_path):
    """With transcoders: each kept latent's activation at every position equals its transcoder's
    encoder (TopK, written out here from its weights) applied to the real MLP's input; the
    drawing tells error nodes and remainders from latents."""
    from safetensors.numpy import load_file

    from fptrace.commands.graph.examples import write_transcoders

    folder = tiny_gpt2()
    d = json.loads(Path(folder, "config.json").read_text())["n_embd"]
    tc = write_transcoders(str(tmp_path / "tc"), range(2), d, 48, k=8)
    out = tmp_path / "t.html"
    r = runner.invoke(app, ["graph", PROMPT, "-m", folder, "--transcoders", tc, "--max-nodes",
                            "8", "--node-threshold", "1", "--edge-threshold", "1", "--json",
                            "--html", str(out)])
    assert r.exit_code == 0, r.output
    g = json.loads(r.stdout)
    kinds = {n["id"]: n["kind"] for n in _drawing(out)["nodes"]}  # error nodes drawn as such
    assert {n["node_type"]: kinds[n["node_id"]] for n in g["nodes"]} == {
        "embedding": "token", "latent": "node", "other latents": "remainder", "error": "error",
        "logit": "output"}
    x = _gpt2_mlp(folder, [t["id"] for t in g["tokens"]], "in")
    latents = [n for n in g["nodes"] if n["node_type"] == "latent"]
    assert latents
    for n in latents:
        w = {k: torch.from_numpy(v).double()
             for k, v in load_file(f"{tc}/layer_{n['layer']}/sae_weights.safetensors").items()}
        pre = x[n["layer"]] @ w["W_enc"] + w["b_enc"]  # (T, d_sae)
        top = pre.topk(8, dim=-1)
        a = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
        assert n["activations"] == pytest.approx(a[:, n["index"]].tolist(), rel=1e-4, abs=1e-6)
    assert all(n["activations"] is None for n in g["nodes"] if n["node_type"] != "latent")


def test_each_nodes_logit_effects(page):
    """Every node but a logit has one effect per logit node, in their order: its direct edge
    (the kept edge's weight where the pruning kept it) and its influence on that logit alone,
    which weighted by the logits' probabilities sum to its influence."""
    _, g = page
    logits = [n for n in g["nodes"] if n["node_type"] == "logit"]
    kept = {(e["source"], e["target"]): e["weight"] for e in g["edges"]}
    found = 0
    for n in g["nodes"]:
        if n["node_type"] == "logit":
            assert n["logits"] == []
            continue
        assert [e["logit"] for e in n["logits"]] == [lg["node_id"] for lg in logits]
        weighted = sum(lg["prob"] * e["influence"]
                       for lg, e in zip(logits, n["logits"], strict=True))
        assert weighted == pytest.approx(n["influence"], rel=1e-9, abs=1e-15)
        for e in n["logits"]:
            if (n["node_id"], e["logit"]) in kept:
                assert e["edge"] == kept[(n["node_id"], e["logit"])]
                found += 1
    assert found


def test_the_drawing_holds_every_kept_node_and_edge(page):
    out, g = page
    d = _drawing(out)
    L = g["model"]["n_layers"]
    assert d["rows"] == ["tokens", *(f"block {b}" for b in range(L)), "logits"]
    assert len(d["columns"]) == len(g["tokens"])
    assert [n["id"] for n in d["nodes"]] == [n["node_id"] for n in g["nodes"]]
    for drawn, n in zip(d["nodes"], g["nodes"], strict=True):
        row = {"embedding": 0, "logit": L + 1}.get(n["node_type"], (n["layer"] or 0) + 1)
        assert (drawn["row"], drawn["position"], drawn["size"]) == \
            (row, n["position"], n["influence"])
        assert drawn["activations"] == (n["activations"] or [])
        assert [(e["node"], e["edge"], e["influence"]) for e in drawn["effects"]] == \
            [(e["logit"], e["edge"], e["influence"]) for e in n["logits"]]
    assert sorted(map(tuple, d["edges"])) == sorted((e["source"], e["target"], e["weight"])
                                                    for e in g["edges"])
    assert [abs(e[2]) for e in d["edges"]] == sorted((abs(e[2]) for e in d["edges"]),
                                                     reverse=True)
    assert d["shown"] == min(len(g["edges"]), 300)


@pytest.mark.system
def test_the_drawing_in_chromium(page):
    """One circle per kept node and one curve per kept edge; a hover highlights exactly the
    node's edges and lists them; a click shows its activations (the JSON's values) and its
    effect on each logit; asking for 10 edges draws the 10 strongest."""
    out, g = page
    ids = [n["node_id"] for n in g["nodes"]]
    with chromium_page(out) as view:
        pic = view.locator("svg.graph")
        assert sorted(pic.locator("circle").evaluate_all(
            "cs => cs.map(c => c.getAttribute('data-id'))")) == sorted(ids)
        assert pic.locator("path.gedge").count() == len(g["edges"])
        assert pic.locator("path.gedge:not(.more)").count() == min(len(g["edges"]), 300)
        assert f"{min(len(g['edges']), 300)} of the {len(g['edges'])} kept edges drawn" in \
            view.inner_text(".section-graph")

        def ends(selector):
            return sorted(pic.locator(selector).evaluate_all(
                "ps => ps.map(p => [p.getAttribute('data-source'), "
                "p.getAttribute('data-target'), Number(p.getAttribute('data-weight'))])"))

        n = max((n for n in g["nodes"] if n["node_type"] == "neuron"),
                key=lambda n: sum(n["node_id"] in (e["source"], e["target"]) for e in g["edges"]))
        mine = [e for e in g["edges"] if n["node_id"] in (e["source"], e["target"])]
        into = [e for e in mine if e["target"] == n["node_id"]]
        assert into and len(into) < len(mine)
        circle = pic.locator(f'circle[data-id="{n["node_id"]}"]')
        circle.hover()
        assert ends("path.gedge.hl") == sorted([e["source"], e["target"], e["weight"]]
                                               for e in mine)
        listed = view.inner_text(".graph-hover")
        assert f"in ({len(into)} kept edges)" in listed
        assert f"out ({len(mine) - len(into)} kept edges)" in listed
        weights = [float(line.split()[0]) for line in listed.splitlines()
                   if line.startswith("  ")]  # each edge's weight, six significant digits
        assert weights == pytest.approx([e["weight"] for e in into] +
                                        [e["weight"] for e in mine if e not in into], rel=1e-5)

        circle.click()
        cells = view.locator(".graph-detail .acts > span")
        got = cells.evaluate_all("cs => cs.map(c => Number(c.getAttribute('data-value')))")
        assert got == n["activations"]
        effects = view.locator(".graph-detail table.effects tbody tr")
        assert effects.evaluate_all("rs => rs.map(r => r.getAttribute('data-node'))") == \
            [e["logit"] for e in n["logits"]]

        view.fill(".section-graph input[type=number]", "10")
        view.dispatch_event(".section-graph input[type=number]", "change")
        view.mouse.move(0, 0)
        assert ends("path.gedge:not(.more)") == sorted(
            [e["source"], e["target"], e["weight"]]
            for e in sorted(g["edges"], key=lambda e: -abs(e["weight"]))[:10])
        assert "10 of the" in view.inner_text(".section-graph .graph-count")


@pytest.fixture(scope="module")
def crowded(tmp_path_factory):
    """(the page of a graph with over 200 neurons kept at one site and ten logits, its --json):
    a tiny GPT-2 whose MLPs have 256 neurons (n_embd 64), 240 of them candidates at each site:
    the crowded sites also keep their remainder ("other neurons"), weaker than most."""
    from collections import Counter

    from conftest import make_gpt2_folder

    base = tmp_path_factory.mktemp("crowded")
    folder, _ = make_gpt2_folder(base, n_embd=64)
    out = base / "g.html"
    r = runner.invoke(app, ["graph", PROMPT, "-m", str(folder), "--neurons", "--per-site", "240",
                            "--max-nodes", "2000", "--node-threshold", "1", "--edge-threshold",
                            "0.8", "--html", str(out), "--json"])
    assert r.exit_code == 0, r.output
    g = json.loads(r.stdout)
    at = Counter((n["layer"], n["position"]) for n in g["nodes"] if n["node_type"] == "neuron")
    assert max(at.values()) >= 200
    assert sum(n["node_type"] == "logit" for n in g["nodes"]) == 10
    assert sum(n["node_type"] == "other neurons" for n in g["nodes"]) >= 2
    return out, g


CIRCLES = """cs => cs.map(c => [c.getAttribute('data-id'), Number(c.getAttribute('cx')),
    Number(c.getAttribute('cy')), Number(c.getAttribute('r')),
    c.getAttribute('display') !== 'none'])"""

# each node's circle scrolled into view: is it what the pointer finds at its centre?
UNDER_POINTER = """cs => cs.filter(c => {
    c.scrollIntoView({block: 'center', inline: 'center'});
    const b = c.getBoundingClientRect();
    return document.elementFromPoint(b.x + b.width / 2, b.y + b.height / 2) !== c;
  }).map(c => c.getAttribute('data-id'))"""

# each node hovered: the edges highlighted and the counts its hover lists
HOVERED = """cs => cs.map(c => {
    c.dispatchEvent(new MouseEvent('mouseenter'));
    const lit = Array.from(document.querySelectorAll('svg.graph path.gedge.hl'),
                           p => [p.getAttribute('data-source'), p.getAttribute('data-target')]);
    const text = document.querySelector('.graph-hover').textContent;
    c.dispatchEvent(new MouseEvent('mouseleave'));
    return [c.getAttribute('data-id'), lit, text.match(/in \\((\\d+) kept/)[1],
            text.match(/out \\((\\d+) kept/)[1]];
  })"""

BOXES = """ls => ls.map(l => { const b = l.getBoundingClientRect();
    return [l.getAttribute('data-id'), b.left, b.top, b.right, b.bottom,
            l.querySelector('title').textContent]; })"""


def _apart(circles):
    """The pairs of drawn circles that overlap (their centres closer than their radii's sum)."""
    import numpy as np

    xy = np.array([(c[1], c[2]) for c in circles])
    r = np.array([c[3] for c in circles])
    gap = np.hypot(*(xy[:, None, :] - xy[None, :, :]).transpose(2, 0, 1)) - (r[:, None] + r)
    np.fill_diagonal(gap, np.inf)
    return [(circles[i][0], circles[j][0]) for i, j in zip(*np.nonzero(gap < 0), strict=True)
            if i < j]


@pytest.mark.system
def test_a_crowded_site_in_chromium(crowded):
    """Over 200 nodes at one site: a crowded cell's remainder and its strongest nodes, 15 in
    all, are drawn and a "+N more" marker holds the rest (hovering it highlights their edges);
    the remainder is drawn however weak (what the named nodes leave out is never hidden); Enter
    on it (keyboard) draws
    them all; before and after, no two circles overlap (cx, cy, r read from the DOM), and
    then every node's circle is what the pointer finds at its centre and hovering it highlights
    exactly its kept edges (a real hover for the weakest); the ten logits' labels do not
    intersect one another or any circle, each holding its full label in its title."""
    out, g = crowded
    cell = {n["node_id"]: (n["layer"], n["position"]) for n in g["nodes"]}
    crowd = {}  # a crowded cell's nodes in the order they are drawn
    for n in g["nodes"]:
        if n["node_type"] in ("neuron", "other neurons"):
            crowd.setdefault(cell[n["node_id"]], []).append(n)
    crowd = {k: sorted(v, key=lambda n: (n["node_type"] == "neuron", -n["influence"]))
             for k, v in crowd.items() if len(v) > 16}
    rest = [n for v in crowd.values() for n in v if n["node_type"] == "other neurons"]
    # the remainders rank low by influence: the drawing, not the data, keeps them in sight
    assert rest and all(sorted(crowd[cell[n["node_id"]]], key=lambda m: -m["influence"]).index(n)
                        >= 15 for n in rest)
    edges = {}
    for e in g["edges"]:
        for end in (e["source"], e["target"]):
            edges.setdefault(end, []).append((e["source"], e["target"]))
    with chromium_page(out) as view:
        circles = view.locator("svg.graph circle.gnode")
        drawn = circles.evaluate_all(CIRCLES)
        assert sorted(c[0] for c in drawn) == sorted(cell)
        shown = [c for c in drawn if c[4]]
        assert _apart(shown) == []
        # a crowded site does not widen the drawing: no column is wider than ten 20 px slots
        # and a margin (the ten logits in a line; a closed crowded cell's grid is 8 wide)
        width = float(view.locator("svg.graph").get_attribute("width"))
        assert width <= 80 + 60 + len(g["tokens"]) * 216
        marks = view.locator("svg.graph .gmore")
        assert marks.count() == len(crowd)
        hidden = {c[0] for c in drawn if not c[4]}
        for here in crowd.values():
            assert {n["node_id"] for n in here[15:]} <= hidden
            assert not {n["node_id"] for n in here[:15]} & hidden
        assert len(hidden) == sum(len(v) - 15 for v in crowd.values())
        assert not {n["node_id"] for n in rest} & hidden
        (layer, pos), here = max(crowd.items(), key=lambda kv: len(kv[1]))
        mark = view.locator(f'svg.graph .gmore[data-cell="{layer + 1}:{pos}"]')
        assert mark.get_attribute("data-hidden") == str(len(here) - 15)
        mark.hover()
        lit = view.locator("svg.graph path.gedge.hl").evaluate_all(
            "ps => ps.map(p => [p.getAttribute('data-source'), p.getAttribute('data-target')])")
        assert sorted(map(tuple, lit)) == sorted(
            {e for n in here[15:] for e in edges.get(n["node_id"], [])})
        assert f"{len(here) - 15} more nodes at block {layer}" in view.inner_text(".graph-hover")

        for k in range(marks.count()):  # every crowded cell opened from the keyboard
            marks.nth(k).focus()
            view.keyboard.press("Enter")
            assert marks.nth(k).get_attribute("aria-expanded") == "true"
        drawn = circles.evaluate_all(CIRCLES)
        assert all(c[4] for c in drawn) and len(drawn) == len(g["nodes"])
        assert _apart(drawn) == []
        assert circles.evaluate_all(UNDER_POINTER) == []
        view.mouse.move(0, 0)  # the pointer off the drawing: it hovers no node of its own
        for node, got, into, out_ in circles.evaluate_all(HOVERED):
            mine = edges.get(node, [])
            assert sorted(map(tuple, got)) == sorted(set(mine))
            assert int(into) == sum(t == node for _, t in mine)
            assert int(out_) == sum(s == node for s, _ in mine)
        weakest = here[-1]["node_id"]
        view.locator(f'svg.graph circle[data-id="{weakest}"]').hover()
        lit = view.locator("svg.graph path.gedge.hl").evaluate_all(
            "ps => ps.map(p => [p.getAttribute('data-source'), p.getAttribute('data-target')])")
        assert sorted(map(tuple, lit)) == sorted(set(edges[weakest]))

        logits = {n["node_id"]: n["label"] for n in g["nodes"] if n["node_type"] == "logit"}
        titles = {n["id"]: n["label"] for n in _drawing(out)["nodes"] if n["id"] in logits}
        labels = view.locator("svg.graph text.out-label").evaluate_all(BOXES)
        assert {b[0]: b[5] for b in labels} == titles and len(labels) == 10
        assert all(titles[k].endswith(v) for k, v in logits.items())  # the token, in full
        rings = circles.evaluate_all(BOXES.replace(
            "l.querySelector('title').textContent", "''"))

        def meet(a, b):
            return a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]
        assert not [(a[0], b[0]) for i, a in enumerate(labels) for b in labels[i + 1:]
                    if meet(a, b)]
        assert not [(a[0], b[0]) for a in labels for b in rings if meet(a, b)]

        marks.nth(0).click()  # and back: the strongest 15 again
        assert marks.nth(0).get_attribute("aria-expanded") == "false"
        assert sum(not c[4] for c in circles.evaluate_all(CIRCLES)) > 0


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


@pytest.mark.system
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
    assert _drawing(out)["rows"][0] == "tokens"


def test_verify_has_a_section_of_its_own(tmp_path):
    """--verify N on the page: a section of its own (its heading, its table out of the graph's
    section), a row per removed node in the graph's --json order: minus its edge into the top
    logit (the kept edge's weight: every edge is kept here), the frozen change through every
    path, the real change, the held intervention's largest relative miss; the real change is
    the real float32 model's own (a hook zeroing the neuron at its down projection's input)."""
    import re

    from transformers import GPT2LMHeadModel

    out = tmp_path / "v.html"
    r = runner.invoke(app, ["graph", PROMPT, "-m", tiny_gpt2(), "--neurons", "--max-nodes", "8",
                            "--node-threshold", "1", "--edge-threshold", "1", "--verify", "3",
                            "--html", str(out), "--json"])
    assert r.exit_code == 0, r.output
    g = json.loads(r.stdout)
    html = out.read_text(encoding="utf-8")
    head = html.index("<h2>Verified by intervention (--verify)</h2>")
    assert head > html.index("<h2>How the answer was computed: the attribution graph</h2>")
    assert html.count("Verified by removal (--verify)") == 1  # the table, in its own section
    assert html.index("Verified by removal (--verify)") > head
    data = json.loads(re.search(r'<script type="application/json" id="fptrace-data">(.*?)'
                                r'</script>', html, re.S).group(1))
    titles = [s["title"] for s in data["sections"]]
    assert titles.index("Verified by intervention (--verify)") == \
        titles.index("Attribution graph") + 1
    (m,) = next(s for s in data["sections"]
                if s["title"] == "Verified by intervention (--verify)")["heatmaps"]
    verified = g["verified"]
    assert len(verified) == 3 and m["rows"] == [v["node"] for v in verified]
    assert m["values"] == [[v["direct"], v["predicted"], v["real"], v["difference"]]
                           for v in verified]
    top = max((n for n in g["nodes"] if n["node_type"] == "logit"), key=lambda n: n["prob"])
    assert g["verify_logit"] == top["label"].strip("'")
    by_label = {n["label"]: n for n in g["nodes"]}
    edges = {(e["source"], e["target"]): e["weight"] for e in g["edges"]}
    model = GPT2LMHeadModel.from_pretrained(tiny_gpt2()).eval()
    ids = torch.tensor([[t["id"] for t in g["tokens"]]])

    def logit(zero=None):
        handle = None
        if zero is not None:
            layer, pos, idx = zero

            def pre(module, args):
                a = args[0].clone()
                a[0, pos, idx] = 0.0
                return (a,)
            handle = model.transformer.h[layer].mlp.c_proj.register_forward_pre_hook(pre)
        try:
            with torch.inference_mode():
                return float(model(ids).logits[0, -1, top["index"]].double())
        finally:
            if handle is not None:
                handle.remove()

    base = logit()
    for v, row in zip(verified, m["values"], strict=True):
        n = by_label[v["node"]]
        assert row[0] == -edges.get((n["node_id"], top["node_id"]), 0.0)
        assert row[3] <= 1e-5  # held: every computed node moved by minus its edge
        real = logit((n["layer"], n["position"], n["index"])) - base
        assert row[2] == pytest.approx(real, rel=1e-4, abs=1e-5)
