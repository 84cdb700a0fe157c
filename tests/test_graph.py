"""`fptrace graph --neurons`: exact on a Llama-like (SwiGLU, grouped-query attention) and a
GPT-2-like (GELU, biases) model against the real model's hooks and logits; a fault fails the
check (exit 5, nothing written); an edge equals an intervention in the model with its freezing
replayed; pruning keeps the logits and grows with its thresholds; the graph file's structure;
bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import build_tiny, real_neurons, replay, tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.graph import core as graph_core
from fptrace.commands.graph import freezing
from fptrace.commands.graph.core import graph
from fptrace.commands.graph.influence import Adjacency, prune
from fptrace.commands.graph.rows import Candidates, Rows
from fptrace.errors import BadInput
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 9, 311]
FAMILIES = ("llama", "gpt2")
runner = CliRunner()


@pytest.fixture(scope="module", params=FAMILIES)
def made(request):
    """(the tiny model ready to trace, its graph)."""
    lm = wrap_model(build_tiny(request.param), name=f"tiny-{request.param}",
                    random_weights=True)
    return lm, graph(lm, IDS, max_nodes=12, per_site=3, node_threshold=1.0, edge_threshold=1.0)


def test_every_node_sums_to_the_real_model(made):
    lm, g = made
    assert g.ok and g.checks[0].name == "graph_sums"
    assert g.checks[0].value < 1e-9  # float64: far inside the 1e-5 rule
    assert g.computed == 12 and g.scores.replacement == 1.0 and g.scores.completeness == 1.0
    acts, logits = real_neurons(lm, IDS)
    neurons = [n for n in g.nodes if n.node_type == "neuron"]
    assert neurons
    for n in neurons:  # the value the graph reproduces is the model's own activation
        assert n.value == pytest.approx(float(acts[n.layer][n.position, n.index]), rel=1e-4,
                                        abs=1e-6)
    top = [n for n in g.nodes if n.node_type == "logit"]
    assert top and {n.index for n in top} >= {int(logits.argmax())}
    for n in top:
        assert n.value == pytest.approx(float(logits[n.index]), rel=1e-5, abs=1e-5)
    assert sum(n.prob for n in top) <= 1.0


def _gpt2_frozen():
    """A tiny GPT-2 (biases everywhere, a learned position embedding): the model, its float64
    copy, its MLP sites, the real pass over IDS, two candidates a site and the frozen pass."""
    lm = wrap_model(build_tiny("gpt2"), random_weights=True)
    model, parts = graph_core.float64_copy(lm)
    sites = freezing.mlp_sites(parts.family)
    real = graph_core.real_pass(lm, model, parts, sites, IDS, [len(IDS) - 1])
    with freezing.frozen(model, parts, sites) as p:
        model(torch.tensor([IDS]), use_cache=False, logits_to_keep=torch.tensor([5]))
    return lm, model, parts, sites, real, Candidates.top(real.acts, 2), p


def test_the_sums_hold_on_every_target_against_hooks():
    """Independently of core.py's check: each row's edges plus bias terms, from the frozen
    pass, equal the float64 model's value read by a hook (GPT-2: biases everywhere)."""
    _, _, _, _, real, cand, p = _gpt2_frozen()
    targets = [cand.target(c) for c in range(0, len(cand), 2)]  # the top one of each site
    assert len(targets) == 3 * len(IDS)
    targets.append(graph_core.Target(None, 0, 7))
    r = graph_core.rows(p, targets, cand)
    want = [float(real.logits[0, 7]) if t.layer is None else
            float(real.acts[t.layer, t.position, t.index]) for t in targets]
    np.testing.assert_allclose(r.total, want, rtol=1e-10, atol=1e-12)
    assert np.abs(r.bias).max() > 1e-3  # the biases matter here


def test_a_prefix_pass_gives_the_whole_passes_rows():
    """A target's rows from the frozen pass of the prompt's first t + 1 positions (core.py's
    prefix passes) sum to the float64 model's value read by a hook, as those of the whole
    prompt's pass do, and equal them edge by edge, nothing from a later position (GPT-2: a
    learned position embedding, biases everywhere)."""
    lm, model, parts, sites, real, cand, whole = _gpt2_frozen()
    L, T, m = real.acts.shape
    ends = graph_core.prefix_ends(T, L, m, lm.config.hidden_size, lm.config.num_attention_heads)
    assert ends == [2, 3, 5, 6]
    # the bundled model's shapes: four prefixes at 16 tokens, the whole pass alone at 1,024
    assert len(graph_core.prefix_ends(16, 30, 1536, 576, 9)) == 4
    assert graph_core.prefix_ends(1024, 30, 1536, 576, 9) == [1024]
    for end in ends[:-1]:
        with freezing.frozen(model, parts, sites) as prefix:
            model(torch.tensor([IDS[:end]]), use_cache=False, logits_to_keep=1)
        targets = [cand.target(c) for c in range(len(cand)) if cand.position[c] == end - 1]
        short, full = graph_core.rows(prefix, targets, cand), graph_core.rows(whole, targets, cand)
        want = [float(real.acts[t.layer, t.position, t.index]) for t in targets]
        np.testing.assert_allclose(short.total, want, rtol=1e-10, atol=1e-12)
        for a, b in ((short.tokens, full.tokens), (short.chosen, full.chosen),
                     (short.sites, full.sites), (short.bias, full.bias)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)
        assert not full.sites[..., end:].any() and not full.tokens[:, end:].any()


def _perturbed_rows(real_rows):
    def rows(p, targets, cand):
        r = real_rows(p, targets, cand)
        tokens = r.tokens.copy()
        tokens[:, 0] += 1e-3
        return Rows(tokens=tokens, chosen=r.chosen, sites=r.sites, errors=r.errors, bias=r.bias)
    return rows


def test_a_perturbed_edge_fails_the_check(monkeypatch):
    lm = wrap_model(build_tiny("gpt2"), random_weights=True)
    monkeypatch.setattr(graph_core, "rows", _perturbed_rows(graph_core.rows))
    g = graph(lm, IDS, max_nodes=4, per_site=2)
    assert not g.ok and not g.checks[0].ok and g.checks[0].value > 1e-5
    assert g.checks[0].worst  # names the node


def test_a_wrong_frozen_gate_fails_the_check(monkeypatch):
    lm = wrap_model(build_tiny("llama"), random_weights=True)
    real_hook = freezing._down_hook

    def wrong(state, layer):
        hook = real_hook(state, layer)

        def changed(module, args):
            out = hook(module, args)
            state.acts[layer] = state.acts[layer] * 1.001  # r off by 0.1 %
            return out
        return changed

    monkeypatch.setattr(freezing, "_down_hook", wrong)
    g = graph(lm, IDS, max_nodes=4, per_site=2)
    assert not g.checks[0].ok and g.checks[0].worst.startswith("L")


def test_a_failing_graph_exits_5_and_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(graph_core, "rows", _perturbed_rows(graph_core.rows))
    out = tmp_path / "g.json"
    r = runner.invoke(app, ["graph", "The cat sat", "-m", tiny_gpt2(), "--neurons",
                            "--max-nodes", "3", "--graph-json", str(out)])
    assert r.exit_code == 5, r.output
    assert "graph_sums" in r.stderr and " at L" in r.stderr and not out.exists()


def test_the_terminal_view_at_80_columns():
    r = runner.invoke(app, ["graph", "The cat sat on the", "-m", tiny_gpt2(), "--neurons",
                            "--max-nodes", "4"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    for text in ("Frozen at their values", "attention patterns", "Strongest paths",
                 "most influential nodes", "✓ exact"):
        assert text in r.stdout


def _replayed(model, parts, sites, ids, clean):
    """The float64 model run with its freezing replayed from a clean run's values (norm gains,
    attention patterns, neuron gates and every neuron's activation held), written here
    without autograd: returns the clean constants, and a function that runs it with a source
    neuron's activation moved by delta and returns every layer's gated pre-activation r·u."""
    from transformers import AttentionInterface

    from fptrace.core.attribution import frozen_norm

    norms = [m for m in model.modules() if freezing.is_norm(m)]
    kept: dict = {"gain": {}, "pattern": {}, "r": {}, "a": {}}

    def attend(module, q, k, v, mask, scaling=None, dropout=0.0, **kw):
        pattern = kept["pattern"][module.layer_idx]  # (1, nh, T, T)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        return (pattern @ v).transpose(1, 2).contiguous(), pattern

    AttentionInterface.register("test-replay", attend)
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionMaskInterface.register("test-replay", eager_mask)
    for i, p in enumerate(clean["patterns"]):
        kept["pattern"][i] = p
    kept["r"], kept["a"] = clean["r"], clean["a"]

    def run(source=None, delta=0.0):
        handles, u_now, out = [], {}, {}
        for m in norms:
            def nh(mod, a, o):
                x = a[0]
                if mod not in kept["gain"]:
                    kept["gain"][mod] = frozen_norm(mod, x, parts.family.norm_type)
                centre, gain, bias = kept["gain"][mod]
                y = (x - x.mean(-1, keepdim=True) if centre else x) * gain
                return y if bias is None else y + bias
            handles.append(m.register_forward_hook(nh))
        for i, blk in enumerate(parts.blocks):
            def up(mod, a, o, i=i):
                u = o if sites.up_part is None else o.chunk(sites.up_part[1], -1)[sites.up_part[0]]
                u_now[i] = u
            def down(mod, a, i=i):
                out[i] = kept["r"][i] * u_now[i]
                a_new = kept["a"][i].clone()
                if source is not None and source[0] == i:
                    a_new[0, source[1], source[2]] += delta
                return (a_new,)
            handles.append(blk.get_submodule(sites.up).register_forward_hook(up))
            handles.append(blk.get_submodule(sites.down).register_forward_pre_hook(down))
        replay(model, ids, handles, "test-replay")
        return out
    return run


def _clean(model, parts, sites, ids):
    """A clean float64 run: each attention pattern (softmax in float64), each layer's gate
    r = a/u and activation a."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    got = {"patterns": {}, "r": {}, "a": {}}

    def attend(module, q, k, v, mask, scaling=None, dropout=0.0, **kw):
        n = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(n, dim=1), v.repeat_interleave(n, dim=1)
        scores = q @ k.transpose(2, 3) * (scaling or q.shape[-1] ** -0.5) + mask
        pattern = torch.softmax(scores, dim=-1)
        got["patterns"][module.layer_idx] = pattern
        return (pattern @ v).transpose(1, 2).contiguous(), pattern

    AttentionInterface.register("test-clean", attend)
    AttentionMaskInterface.register("test-clean", eager_mask)
    u_now, handles = {}, []
    for i, blk in enumerate(parts.blocks):
        def up(mod, a, o, i=i):
            u_now[i] = o if sites.up_part is None else \
                o.chunk(sites.up_part[1], -1)[sites.up_part[0]]

        def down(mod, a, i=i):
            got["a"][i] = a[0].clone()
            got["r"][i] = torch.where(u_now[i] != 0, a[0] / u_now[i], 0.0)
        handles.append(blk.get_submodule(sites.up).register_forward_hook(up))
        handles.append(blk.get_submodule(sites.down).register_forward_pre_hook(down))
    hooks = freezing.float64_norms(model, parts)
    handles += [h.module.register_forward_hook(h.fn) for h in hooks]
    before = model.config._attn_implementation
    model.set_attn_implementation("test-clean")
    try:
        with torch.no_grad():
            model(torch.tensor([ids]), use_cache=False)
    finally:
        model.set_attn_implementation(before)
        for h in handles:
            h.remove()
    got["patterns"] = [got["patterns"][i] for i in range(len(parts.blocks))]
    return got


@pytest.mark.parametrize("family", FAMILIES)
def test_an_edge_is_an_intervention(family):
    """Moving a source neuron's activation by delta, with attention patterns, norm scales,
    gates and every other neuron held at their clean values, moves the target's activation by
    exactly edge / activation × delta."""
    lm = wrap_model(build_tiny(family), random_weights=True)
    g = graph(lm, IDS, max_nodes=20, per_site=3, node_threshold=1.0, edge_threshold=1.0)
    by_id = {n.node_id: n for n in g.nodes}
    pairs = [(by_id[e.source], by_id[e.target], e.weight) for e in g.edges
             if by_id[e.source].node_type == "neuron" and by_id[e.target].node_type == "neuron"
             and abs(e.weight) > 1e-6]
    assert pairs
    model, parts = graph_core.float64_copy(lm)
    sites = freezing.mlp_sites(parts.family)
    run = _replayed(model, parts, sites, IDS, _clean(model, parts, sites, IDS))
    base = run()
    for s, t, w in sorted(pairs, key=lambda p: -abs(p[2]))[:3]:
        assert float(base[t.layer][0, t.position, t.index]) == pytest.approx(t.value, rel=1e-9)
        delta = 0.5 * s.value
        moved = run((s.layer, s.position, s.index), delta)
        change = float(moved[t.layer][0, t.position, t.index] - base[t.layer][0, t.position,
                                                                               t.index])
        assert change == pytest.approx(w / s.value * delta, rel=1e-8, abs=1e-12)


def test_pruning_keeps_the_logits_and_grows_with_its_thresholds():
    lm = wrap_model(build_tiny("gpt2"), random_weights=True)
    graphs = {x: graph(lm, IDS, max_nodes=10, per_site=2, node_threshold=x, edge_threshold=1.0)
              for x in (0.3, 0.6, 0.9)}
    ids = {x: {n.node_id for n in g.nodes} for x, g in graphs.items()}
    assert ids[0.3] <= ids[0.6] <= ids[0.9]
    for g in graphs.values():
        kinds = [n.node_type for n in g.nodes]
        assert kinds.count("embedding") == len(IDS) and "logit" in kinds
    # edges, on a random acyclic graph: more edges kept as the threshold grows
    rng = np.random.default_rng(0)
    n = 30
    A = np.tril(rng.normal(size=(n, n)) * (rng.random((n, n)) < 0.4), k=-1)
    w = np.zeros(n)
    w[-2:] = (0.7, 0.3)
    kept = [prune(Adjacency.dense(A), w, 20, 4, 1.0, x) for x in (0.5, 0.8, 0.95, 1.0)]
    for a, b in zip(kept, kept[1:]):
        assert (a.edges <= b.edges).all() and (a.nodes <= b.nodes).all()
    assert kept[0].nodes[-6:].all()  # tokens and logits always


def test_the_influence_is_the_sum_over_every_path_in_any_order_of_the_nodes():
    """influence.paths_sum: Σ_k v·S^k by one triangular solve where the nodes' order is a
    topological one (every edge from a lower index to a higher), by the sum itself where it is
    not (the rows given in another order, an edge the other way), against the sum written out
    here with numpy's matrix powers; a cycle is refused."""
    from fptrace.commands.graph.influence import normalized, paths_sum

    rng = np.random.default_rng(1)
    n, r = 40, 25
    nodes = np.sort(rng.choice(np.arange(5, n), r, replace=False))
    rows = np.zeros((r, n))
    for i, t in enumerate(nodes):  # edges from nodes of lower index only
        rows[i, :t] = rng.normal(size=t) * (rng.random(t) < 0.5)
    Ah = normalized(rows)
    v = rng.random(r)

    def written_out(Ah, v, nodes):
        S = Ah[:, nodes]
        return sum(v @ np.linalg.matrix_power(S, k) for k in range(r + 1))

    want = written_out(Ah, v, nodes)
    assert np.allclose(paths_sum(Ah, v, nodes), want, rtol=1e-13, atol=1e-15)
    shuffled = rng.permutation(r)  # the rows in another order: the same sums
    got = paths_sum(Ah[shuffled], v[shuffled], nodes[shuffled])
    assert np.allclose(got, want[shuffled], rtol=1e-13, atol=1e-15)
    V = np.stack([v, rng.random(r)])  # several weightings at once
    assert np.allclose(paths_sum(Ah, V, nodes)[1], written_out(Ah, V[1], nodes), rtol=1e-13)
    # an edge from a higher index to a lower one (still acyclic): the step-by-step sum
    lo, hi = 3, 20
    back = rows.copy()
    back[:, nodes[lo]] = 0.0  # nothing reads node lo ...
    back[lo, :] = 0.0
    back[lo, nodes[hi]] = 1.0  # ... and it reads node hi, of a higher index
    Bh = normalized(back)
    assert np.allclose(paths_sum(Bh, v, nodes), written_out(Bh, v, nodes), rtol=1e-13,
                       atol=1e-15)
    cyc = rows.copy()
    cyc[:2] = 0.0
    cyc[0, nodes[1]] = 1.0  # 0 reads only 1 and 1 only 0: a cycle that never fades
    cyc[1, nodes[0]] = 1.0
    with pytest.raises(RuntimeError, match="cycle"):
        paths_sum(normalized(cyc), v, nodes)


def test_the_graph_file_opens_in_circuit_tracers_format(tmp_path):
    out = tmp_path / "g.json"
    args = ["graph", "The cat sat on the", "-m", tiny_gpt2(), "--neurons", "--max-nodes", "6",
            "--graph-json", str(out), "--json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kind"] == "graph" and doc["ok"]
    f = json.loads(out.read_text())
    assert {"metadata", "qParams", "nodes", "links"} <= set(f)
    assert {"slug", "scan", "prompt_tokens", "prompt", "node_threshold"} <= set(f["metadata"])
    ids = {n["node_id"] for n in f["nodes"]}
    for n in f["nodes"]:
        assert {"node_id", "feature", "layer", "ctx_idx", "feature_type", "influence",
                "activation", "jsNodeId"} <= set(n)
    types = {n["feature_type"] for n in f["nodes"]}
    assert {"embedding", "logit"} <= types
    assert all(n["layer"] == "E" for n in f["nodes"] if n["feature_type"] == "embedding")
    assert all(n["layer"] == "3" for n in f["nodes"] if n["feature_type"] == "logit")
    assert f["links"] and all(e["source"] in ids and e["target"] in ids for e in f["links"])
    assert runner.invoke(app, args).exit_code == 0  # its own file is replaced without --force


@pytest.mark.parametrize("args, says", [
    (["--node-threshold", "1.5"], "--node-threshold"),
    (["--edge-threshold", "nan"], "--edge-threshold"),
    (["--max-nodes", "0"], "--max-nodes"),
    (["--max-nodes", "x"], "--max-nodes"),
    (["--positions", "9"], "positions"),
])
def test_bad_inputs_exit_2_with_one_line(args, says, tmp_path):
    out = tmp_path / "g.json"
    r = runner.invoke(app, ["graph", "The cat sat", "-m", tiny_gpt2(), "--neurons",
                            "--graph-json", str(out), *args])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("fptrace: error")]
    assert len(errors) == 1 and says in errors[0]
    assert not out.exists()


def test_a_family_it_cannot_freeze_is_refused():
    lm = wrap_model(build_tiny("starcoder2"), random_weights=True)  # no family file
    with pytest.raises(BadInput, match="no family file") as e:
        graph(lm, IDS)
    assert "\n" not in str(e.value)
    r = runner.invoke(app, ["graph", "x"])  # before anything is loaded
    assert r.exit_code == 2 and "--neurons" in r.stderr


def test_the_api_names_its_parameters_and_takes_query_positions():
    lm = wrap_model(build_tiny("gpt2"), random_weights=True)
    for kw, name in (({"node_threshold": float("nan")}, "node_threshold"),
                     ({"edge_threshold": 2}, "edge_threshold"), ({"max_nodes": 0}, "max_nodes"),
                     ({"positions": [9]}, "positions")):
        with pytest.raises(BadInput, match=name):
            graph(lm, IDS, **kw)
    g = graph(lm, IDS, positions=[2, -1], target="#7", max_nodes=4, per_site=2)
    assert g.ok and g.queries == (2, 5)
    logits = [n for n in g.nodes if n.node_type == "logit"]
    assert sorted((n.position, n.index) for n in logits) == [(2, 7), (5, 7)]
    assert len(g.tokens) == 6


def test_the_targets_per_pass_change_no_number():
    """Fewer targets per backward pass (what a long prompt gets: rows_fitting) give the same
    graph; the count follows the prompt's length."""
    lm = wrap_model(build_tiny("llama"), random_weights=True)
    a = graph(lm, IDS, max_nodes=10, per_site=2, batch_size=2)
    real = graph_core.rows_fitting
    try:  # what a long prompt gets: one target a pass, the rounds as asked
        graph_core.rows_fitting = lambda *args, **kw: 1
        b = graph(lm, IDS, max_nodes=10, per_site=2, batch_size=2)
    finally:
        graph_core.rows_fitting = real
    assert [n.node_id for n in a.nodes] == [n.node_id for n in b.nodes]
    for x, y in zip(a.edges, b.edges, strict=True):
        assert (x.source, x.target) == (y.source, y.target)
        assert x.weight == pytest.approx(y.weight, rel=1e-12, abs=1e-15)
    assert graph_core.rows_fitting(16, 30, 1536, 576, 32) == 32  # the bundled model
    assert graph_core.rows_fitting(256, 30, 1536, 576, 32) == 8
    assert graph_core.rows_fitting(1024, 30, 1536, 576, 32) == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_recomputed_patterns_give_the_same_graph(family, monkeypatch):
    """A long prompt's pass recomputes each block's frozen pattern in every backward pass
    instead of holding it (memory linear in T): the same pattern, so the same graph (equal bits
    on this machine; compared to float64's 1e-12, since the backward's products run through
    other kernels than autograd's own, whose summation order another CPU may choose apart)."""
    lm = wrap_model(build_tiny(family), random_weights=True)
    computed = []  # the patterns computed: once a block in the forward pass when held
    pattern = freezing.frozen_pattern
    monkeypatch.setattr(freezing, "frozen_pattern", lambda *a: computed.append(1) or pattern(*a))
    held = graph(lm, IDS, max_nodes=10, per_site=2)
    once = len(computed)
    monkeypatch.setattr(freezing, "HELD_PATTERNS_BYTES", 0)
    recomputed = graph(lm, IDS, max_nodes=10, per_site=2)
    assert len(computed) - once > once  # and again in the backward passes
    assert recomputed.ok
    assert [n.node_id for n in held.nodes] == [n.node_id for n in recomputed.nodes]
    for x, y in zip(held.edges, recomputed.edges, strict=True):
        assert (x.source, x.target) == (y.source, y.target)
        assert x.weight == pytest.approx(y.weight, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("family", FAMILIES)
def test_verify_removes_the_top_nodes_and_holds_every_edge(family):
    """--verify: each of the N most influential neurons removed, every other node held, changes
    every computed node by minus its edge (graph_verify, float64); `direct` is minus its edge
    into the top logit, and `held` (that logit's measured change) equals it; `real` is the top
    logit's change when a hook on the float64 model's own down projection zeroes the neuron
    (nothing frozen)."""
    lm = wrap_model(build_tiny(family), random_weights=True)
    g = graph(lm, IDS, max_nodes=12, per_site=3, node_threshold=1.0, edge_threshold=1.0,
              verify=5)
    check = g.checks[-1]
    assert g.ok and check.name == "graph_verify" and check.value < 1e-9
    neurons = [n for n in g.nodes if n.node_type == "neuron"][:5]
    assert [v.node for v in g.verified] == [n.label for n in neurons]
    top = max((n for n in g.nodes if n.node_type == "logit"), key=lambda n: n.prob)
    assert g.verify_logit == lm.token_text(top.index)
    weight = {(e.source, e.target): e.weight for e in g.edges}
    model, parts = graph_core.float64_copy(lm)
    sites = freezing.mlp_sites(parts.family)
    for n, v in zip(neurons, g.verified, strict=True):
        assert v.direct == pytest.approx(-weight.get((n.node_id, top.node_id), 0.0), abs=1e-15)
        # the held intervention's measured change (a forward pass) is the edge's (a backward)
        assert v.held == pytest.approx(v.direct, rel=1e-9, abs=1e-12)
        assert v.targets >= 1 and v.largest_edge > 0

        def zero(mod, a, n=n):
            x = a[0].clone()
            x[0, n.position, n.index] = 0.0
            return (x,)
        logits = []
        for hook in (None, zero):
            h = None if hook is None else \
                parts.blocks[n.layer].get_submodule(sites.down).register_forward_pre_hook(hook)
            with torch.no_grad():
                logits.append(float(model(torch.tensor([IDS]), use_cache=False).logits[
                    0, -1, top.index]))
            if h is not None:
                h.remove()
        assert v.real == pytest.approx(logits[1] - logits[0], rel=1e-9, abs=1e-12)
    # with a neuron removed and the others following linearly, the prediction differs from the
    # direct effect where a path runs through another neuron; on a random model at least once
    assert any(abs(v.predicted - v.direct) > 1e-12 for v in g.verified)


def test_verify_catches_an_edge_the_sums_do_not():
    """An edge into a node made 1 % larger in the kept columns only (its site's sum, and so
    graph_sums, unchanged): the intervention disagrees, graph_verify fails and names the node;
    the command exits 5."""
    def scaled(real_rows):
        def rows(p, targets, cand):
            r = real_rows(p, targets, cand)
            return Rows(tokens=r.tokens, chosen=r.chosen * 1.01, sites=r.sites,
                        errors=r.errors, bias=r.bias)
        return rows

    lm = wrap_model(build_tiny("llama"), random_weights=True)
    mp = pytest.MonkeyPatch()
    mp.setattr(graph_core, "rows", scaled(graph_core.rows))
    try:
        g = graph(lm, IDS, max_nodes=8, per_site=2, node_threshold=1.0, verify=3)
        r = runner.invoke(app, ["graph", "The cat sat", "-m", tiny_gpt2(), "--neurons",
                                "--max-nodes", "6", "--node-threshold", "1", "--verify", "2"])
    finally:
        mp.undo()
    sums, verify = g.checks[0], g.checks[-1]
    assert sums.ok and not verify.ok and verify.name == "graph_verify" and not g.ok
    assert verify.value > 1e-3 and verify.worst.startswith("L")
    assert r.exit_code == 5 and "graph_verify" in r.stderr, r.output


def test_verify_on_transcoders_holds_every_edge(tmp_path):
    from fptrace.commands.graph.examples import write_transcoders

    lm = wrap_model(build_tiny("llama"), random_weights=True)
    d = lm.model.config.hidden_size
    write_transcoders(str(tmp_path / "tc"), range(lm.model.config.num_hidden_layers), d, 32)
    g = graph(lm, IDS, transcoders=str(tmp_path / "tc"), max_nodes=10, per_site=3, verify=4)
    assert g.ok and g.checks[-1].name == "graph_verify" and g.checks[-1].value < 1e-9
    assert len(g.verified) == 4 and all(v.node.startswith("L") for v in g.verified)


def test_verify_bad_inputs():
    lm = wrap_model(build_tiny("gpt2"), random_weights=True)
    with pytest.raises(BadInput, match="verify"):
        graph(lm, IDS, verify=-1)
    for bad in ("-1", "x", "²"):
        r = runner.invoke(app, ["graph", "The cat sat", "-m", tiny_gpt2(), "--neurons",
                                "--verify", bad])
        assert r.exit_code == 2 and "--verify" in r.stderr, r.output


def test_node_ids_are_unique_where_circuit_tracers_spelling_collides(tmp_path):
    """circuit-tracer spells an error node 0_{layer}_{position}, the spelling of block 0's
    feature number `layer` at that position too; fptrace's ids (and its graph file's) must name
    one node each. With every block-0 neuron kept but one per site, and the remainders kept,
    that spelling would collide here (three positions: a quarter of six's edges)."""
    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    m = lm.model.config.intermediate_size
    g = graph(lm, IDS[:3], max_nodes=100_000, per_site=m - 1, node_threshold=1.0,
              edge_threshold=1.0)
    rest = {(n.layer, n.position) for n in g.nodes if n.node_type == "other neurons"}
    block0 = {(n.index, n.position) for n in g.nodes if n.node_type == "neuron" and n.layer == 0}
    assert rest & block0  # a remainder and a block-0 neuron that "0_{layer}_{pos}" would merge
    ids = [n.node_id for n in g.nodes]
    assert len(set(ids)) == len(ids)
    from fptrace.commands.graph.frontend import graph_file

    f = graph_file(g)
    assert len({n["node_id"] for n in f["nodes"]}) == len(f["nodes"])
    by_id = {n.node_id: n for n in g.nodes}
    for e in g.edges:  # every edge names the node it means
        assert by_id[e.source].node_type != "logit" and e.target in by_id


def test_find_threshold_made_in_chunks_is_the_whole_running_sum(monkeypatch):
    """influence.find_threshold sums the sorted scores a chunk at a time (no copy of a big
    graph's edge scores): the threshold is the one the whole running sum gives, bit for bit
    (circuit-tracer's find_threshold: np.cumsum of the sorted scores over their sum)."""
    from fptrace.commands.graph import influence

    def whole(scores, fraction):
        s = np.sort(scores.ravel())[::-1]
        total = s.sum()
        if total <= 0:
            return 0.0
        i = int(np.searchsorted(np.cumsum(s) / total, fraction))
        return float(s[min(i, len(s) - 1)])

    rng = np.random.default_rng(0)
    monkeypatch.setattr(influence, "CHUNK", 7)
    for _ in range(200):
        a = rng.random((int(rng.integers(1, 40)), int(rng.integers(1, 200)))) ** 4
        a[rng.random(a.shape) < 0.7] = 0.0
        for fraction in (0.5, 0.8, 0.98, 1.0):
            assert influence.find_threshold(a, fraction) == whole(a, fraction)
    assert influence.find_threshold(np.zeros((3, 4)), 0.8) == 0.0
