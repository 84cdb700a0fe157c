"""`fptrace graph --neurons` on mixtures of experts (Mixtral; Qwen2-MoE with its gated shared
expert; DeepSeek-V3 with a dense first block, grouped top-k and a routed scaling factor; Qwen3-MoE
and OLMoE): against the model itself. Each expert neuron's value and its edges plus bias terms
against act(gate) · up recomputed here from the MLP's input and the router's own output (hooks on
the float64 model's modules), the logits against the model's own; the router's choice shown
against the router's output; an edge from an expert neuron against an intervention replayed
here with the routing, gates, patterns and norm scales held; experts that cannot be frozen are
refused. gpt-oss: tests/test_graph_gpt_oss.py."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_moe, forward_then_remove, replay

from fptrace.commands.graph import core as graph_core
from fptrace.commands.graph import experts as graph_experts
from fptrace.commands.graph import freezing
from fptrace.commands.graph.core import graph
from fptrace.commands.graph.frontend import graph_file
from fptrace.errors import BadInput, Mismatch
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 9, 311]
# (family, config changes): Qwen3-MoE's first block dense too (mlp_only_layers)
FAMILIES = {"mixtral": {}, "qwen2_moe": {}, "deepseek_v3": {}, "qwen3_moe": {}, "olmoe": {},
            "qwen3_moe-dense0": {"mlp_only_layers": [0]}}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def made(request):
    """(the tiny MoE model, its graph with every node and edge kept)."""
    lm = wrap_model(build_tiny_moe(request.param.split("-")[0], **FAMILIES[request.param]),
                    name=f"tiny-{request.param}", random_weights=True)
    return lm, graph(lm, IDS, max_nodes=16, per_site=3, node_threshold=1.0, edge_threshold=1.0)


def _moe(mlp):
    """Whether an MLP module is a mixture of experts (it has a router)."""
    return hasattr(mlp, "experts")


def _expert_acts(mlp, x, idx):
    """Written here, from the experts' own weight tensors: act(gate) · up (T, E, I) of each
    expert chosen at each position (0 elsewhere), and the shared expert's (T, S) or None."""
    ex = mlp.experts
    E, two_i, _ = ex.gate_up_proj.shape
    out = torch.zeros(x.shape[0], E, two_i // 2, dtype=x.dtype)
    for t in range(x.shape[0]):
        for e in idx[t].tolist():
            gu = ex.gate_up_proj[e] @ x[t]  # (2I,)
            gate, up = gu[:two_i // 2], gu[two_i // 2:]
            out[t, e] = torch.nn.functional.silu(gate) * up
    shared = getattr(mlp, "shared_expert", None) or getattr(mlp, "shared_experts", None)
    s = None
    if shared is not None:
        s = torch.nn.functional.silu(x @ shared.gate_proj.weight.T) * (x @ shared.up_proj.weight.T)
    return out, s


def _clean(model, parts, ids):
    """A clean float64 run read by hooks on the model's own modules: each attention pattern,
    each block's MLP input x, its router's choice (indices, weights), the shared gate, every
    neuron's activation (an MoE block's from _expert_acts, a dense block's where its down
    projection reads it) and the logits."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    got = {"patterns": {}, "x": {}, "route": {}, "gate": {}, "a": {}, "dense_r": {}}

    def attend(module, q, k, v, mask, scaling=None, dropout=0.0, **kw):
        n = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(n, dim=1), v.repeat_interleave(n, dim=1)
        pattern = torch.softmax(q @ k.transpose(2, 3) * scaling + mask, dim=-1)
        got["patterns"][module.layer_idx] = pattern
        return (pattern @ v).transpose(1, 2).contiguous(), pattern

    AttentionInterface.register("test-moe-clean", attend)
    AttentionMaskInterface.register("test-moe-clean", eager_mask)
    handles = []
    for i, mlp in enumerate(parts.mlps):
        handles.append(mlp.register_forward_pre_hook(
            lambda m, a, i=i: got["x"].__setitem__(i, a[0][0].clone())))
        if _moe(mlp):
            handles.append(mlp.gate.register_forward_hook(
                lambda m, a, o, i=i: got["route"].__setitem__(i, (o[2].clone(), o[1].clone()))))
            if getattr(mlp, "shared_expert_gate", None) is not None:
                handles.append(mlp.shared_expert_gate.register_forward_hook(
                    lambda m, a, o, i=i: got["gate"].__setitem__(i, torch.sigmoid(o[:, 0]))))
        else:
            def up(m, a, o, i=i):
                got["dense_r"][i] = o[0]

            def down(m, a, i=i):
                got["a"][i] = a[0][0].clone()
                got["dense_r"][i] = torch.where(got["dense_r"][i] != 0,
                                                a[0][0] / got["dense_r"][i], 0.0)
            handles += [mlp.up_proj.register_forward_hook(up),
                        mlp.down_proj.register_forward_pre_hook(down)]
    handles += [h.module.register_forward_hook(h.fn)
                for h in freezing.float64_norms(model, parts)]
    before = model.config._attn_implementation
    model.set_attn_implementation("test-moe-clean")
    try:
        with torch.no_grad():
            got["logits"] = model(torch.tensor([ids]), use_cache=False).logits[0, -1]
    finally:
        model.set_attn_implementation(before)
        for h in handles:
            h.remove()
    for i, mlp in enumerate(parts.mlps):
        if _moe(mlp):
            routed, shared = _expert_acts(mlp, got["x"][i], got["route"][i][0])
            got["a"][i] = routed.reshape(len(ids), -1) if shared is None else \
                torch.cat([routed.reshape(len(ids), -1), shared], dim=-1)
    return got


def _edges_in(g, node_id):
    return sum(e.weight for e in g.edges if e.target == node_id)


def test_every_node_sums_to_the_model_own_values(made):
    """Each expert neuron's value, and its incoming edges plus bias terms, equal act(gate) · up
    recomputed here from its MLP's input and the router's own choice; each logit node the
    model's own logit; each neuron is of an expert the router chose at its position."""
    lm, g = made
    assert g.ok and g.checks[0].name == "graph_sums" and g.checks[0].value < 1e-12
    model, parts = graph_core.float64_copy(lm)
    clean = _clean(model, parts, IDS)
    neurons = [n for n in g.nodes if n.node_type == "neuron"]
    assert len(neurons) >= 8
    kinds = set()
    for n in neurons:
        want = float(clean["a"][n.layer][n.position, n.index])
        assert want != 0.0
        assert n.value == pytest.approx(want, rel=1e-9)
        assert _edges_in(g, n.node_id) + n.bias == pytest.approx(want, rel=1e-9, abs=1e-12)
        if n.layer in clean["route"]:
            lay = graph_experts.layout(parts.mlps[n.layer], freezing.mlp_sites(parts.family).moe)
            e, k = divmod(n.index, lay.d_expert)
            if n.shared_expert:
                kinds.add("shared")
                assert n.expert is None and n.neuron == n.index - lay.n_experts * lay.d_expert
                assert n.label == f"L{n.layer} shared N{n.neuron} @{n.position}"
            else:
                kinds.add("routed")
                assert (n.expert, n.neuron) == (e, k)
                assert e in clean["route"][n.layer][0][n.position].tolist()
                assert n.label == f"L{n.layer} E{e} N{k} @{n.position}"
        else:
            kinds.add("dense")
            assert n.expert is None and n.neuron is None and n.label.startswith(f"L{n.layer} N")
    assert "routed" in kinds
    if lm.model.config.model_type in ("qwen2_moe", "deepseek_v3"):
        assert "shared" in kinds
    config = lm.model.config
    if config.model_type == "deepseek_v3" or getattr(config, "mlp_only_layers", None):
        assert "dense" in kinds and 0 not in clean["route"]  # its first block is dense
    for n in (n for n in g.nodes if n.node_type == "logit"):
        want = float(clean["logits"][n.index])
        assert n.value == pytest.approx(want, rel=1e-9)
        assert _edges_in(g, n.node_id) + n.bias == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_the_router_choice_shown_is_the_routers_own(made):
    """Each route the graph shows: the experts and weights the router returned (the float64
    copy's exactly; the model's own float32 router's to its rounding), the shared gate its
    sigmoid."""
    lm, g = made
    assert g.routes
    model, parts = graph_core.float64_copy(lm)
    clean = _clean(model, parts, IDS)
    own = {}
    handles = [mlp.gate.register_forward_hook(
        lambda m, a, o, i=i: own.__setitem__(i, (o[2].clone(), o[1].clone())))
        for i, mlp in enumerate(lm.parts.mlps) if _moe(mlp)]
    forward_then_remove(lm, IDS, handles)
    sites = {(n.layer, n.position) for n in g.nodes
             if n.node_type in ("neuron", "other neurons") and n.layer in clean["route"]}
    assert {(r.layer, r.position) for r in g.routes} == sites
    for r in g.routes:
        for idx, w, rel in (*clean["route"][r.layer], 1e-12), (*own[r.layer], 1e-5):
            pairs = dict(zip(idx[r.position].tolist(), w[r.position].tolist(), strict=True))
            assert set(r.experts) == set(pairs)
            assert list(r.weights) == sorted(r.weights, reverse=True)
            for e, v in zip(r.experts, r.weights, strict=True):
                assert v == pytest.approx(pairs[e], rel=rel)
        if r.layer in clean["gate"]:
            assert r.shared_gate == pytest.approx(float(clean["gate"][r.layer][r.position]),
                                                  rel=1e-12)
        else:
            assert r.shared_gate is None


def _replayed(model, parts, ids, clean):
    """run(source, delta) -> every block's activations (T, m) and the last logits, in a forward
    pass written here with the attention patterns, norm scales, routing (choice and weights),
    gates r and shared gates held at the clean run's values and every neuron's activation
    held at its clean value (source's moved by delta): an MoE block's output is the sum over
    each position's chosen experts of weight × down_proj[e] · a, plus the shared expert's."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    from fptrace.core.attribution import frozen_norm

    norms = [m for m in model.modules() if freezing.is_norm(m)]
    gains = {}

    def attend(module, q, k, v, mask, scaling=None, dropout=0.0, **kw):
        pattern = clean["patterns"][module.layer_idx]
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        return (pattern @ v).transpose(1, 2).contiguous(), pattern

    AttentionInterface.register("test-moe-replay", attend)
    AttentionMaskInterface.register("test-moe-replay", eager_mask)

    def r_of(i, mlp):  # each neuron's clean gate r = a / u
        if not _moe(mlp):
            return clean["dense_r"][i]
        x = clean["x"][i]
        u = _up(mlp, x, clean["route"][i][0])
        return torch.where(u != 0, clean["a"][i] / torch.where(u != 0, u, 1.0), 0.0)

    rs = {i: r_of(i, mlp) for i, mlp in enumerate(parts.mlps)}

    def run(source=None, delta=0.0):
        out, handles = {}, []
        for m in norms:
            def nh(mod, a, o):
                x = a[0]
                if mod not in gains:
                    gains[mod] = frozen_norm(mod, x, parts.family.norm_type)
                centre, gain, bias = gains[mod]
                y = (x - x.mean(-1, keepdim=True) if centre else x) * gain
                return y if bias is None else y + bias
            handles.append(m.register_forward_hook(nh))
        for i, mlp in enumerate(parts.mlps):
            held = clean["a"][i].clone()
            if source is not None and source[0] == i:
                held[source[1], source[2]] += delta
            if _moe(mlp):
                def moe(m, a, o, i=i, held=held):
                    x = a[0][0]
                    out[i] = rs[i] * _up(m, x, clean["route"][i][0])
                    return _moe_out(m, held, *clean["route"][i], clean["gate"].get(i))[None]
                handles.append(mlp.register_forward_hook(moe))
            else:
                def up(m, a, o, i=i):
                    out[i] = rs[i] * o[0]

                def down(m, a, held=held):
                    return (held[None],)
                handles += [mlp.up_proj.register_forward_hook(up),
                            mlp.down_proj.register_forward_pre_hook(down)]
        out["logits"] = replay(model, ids, handles, "test-moe-replay").logits[0, -1]
        return out
    return run


def _up(mlp, x, idx):
    """The up pre-activations (T, width) of the chosen experts' neurons (0 elsewhere) and the
    shared expert's."""
    ex = mlp.experts
    E, two_i, _ = ex.gate_up_proj.shape
    I = two_i // 2
    u = torch.zeros(x.shape[0], E, I, dtype=x.dtype)
    for t in range(x.shape[0]):
        for e in idx[t].tolist():
            u[t, e] = ex.gate_up_proj[e][I:] @ x[t]
    u = u.reshape(x.shape[0], -1)
    shared = getattr(mlp, "shared_expert", None) or getattr(mlp, "shared_experts", None)
    return u if shared is None else torch.cat([u, x @ shared.up_proj.weight.T], dim=-1)


def _moe_out(mlp, a, idx, w, gate):
    """(T, d): Σ over each position's chosen experts of weight × down_proj[e] · a_e, plus the
    shared expert's down projection (× its gate)."""
    ex = mlp.experts
    E, d, I = ex.down_proj.shape
    y = torch.zeros(a.shape[0], d, dtype=a.dtype)
    for t in range(a.shape[0]):
        for e, v in zip(idx[t].tolist(), w[t].tolist(), strict=True):
            y[t] += v * (ex.down_proj[e] @ a[t, e * I:(e + 1) * I])
    shared = getattr(mlp, "shared_expert", None) or getattr(mlp, "shared_experts", None)
    if shared is not None:
        s = a[:, E * I:] @ shared.down_proj.weight.T
        y = y + (s if gate is None else gate[:, None] * s)
    return y


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "deepseek_v3"])
def test_an_edge_from_an_expert_neuron_is_an_intervention(family):
    """Moving an expert neuron's activation by delta, with the routing, gates, patterns, norm
    scales and every other neuron held (replayed here), moves each target it has an edge into
    (a neuron, or the logit) by exactly edge / activation × delta."""
    lm = wrap_model(build_tiny_moe(family), random_weights=True)
    g = graph(lm, IDS, max_nodes=16, per_site=3, node_threshold=1.0, edge_threshold=1.0)
    by_id = {n.node_id: n for n in g.nodes}
    pairs = [(by_id[e.source], by_id[e.target], e.weight) for e in g.edges
             if by_id[e.source].node_type == "neuron" and by_id[e.source].neuron is not None
             and by_id[e.target].node_type in ("neuron", "logit") and abs(e.weight) > 1e-6]
    assert any(t.node_type == "neuron" for _, t, _ in pairs)
    assert any(t.node_type == "logit" for _, t, _ in pairs)
    model, parts = graph_core.float64_copy(lm)
    clean = _clean(model, parts, IDS)
    run = _replayed(model, parts, IDS, clean)
    base = run()
    assert float(base["logits"].sub(clean["logits"]).abs().max()) < 1e-12  # the replay is exact

    def value(out, t):
        return float(out["logits"][t.index] if t.node_type == "logit"
                     else out[t.layer][t.position, t.index])

    picked = sorted(pairs, key=lambda p: -abs(p[2]))
    picked = [p for p in picked if p[1].node_type == "neuron"][:3] + \
        [p for p in picked if p[1].node_type == "logit"][:2]
    for s, t, w in picked:
        assert value(base, t) == pytest.approx(t.value, rel=1e-9)
        delta = 0.5 * s.value
        moved = run((s.layer, s.position, s.index), delta)
        assert value(moved, t) - value(base, t) == pytest.approx(w / s.value * delta, rel=1e-8,
                                                                 abs=1e-12)


def test_verify_removes_expert_neurons_and_holds_every_edge():
    lm = wrap_model(build_tiny_moe("qwen2_moe"), random_weights=True)
    g = graph(lm, IDS, max_nodes=12, per_site=3, verify=3)
    assert g.ok and [c.name for c in g.checks] == ["graph_sums", "graph_model", "graph_heads",
                                                   "graph_verify"]
    assert g.checks[-1].value < 1e-8 and len(g.verified) == 3
    assert all(" N" in v.node and ("E" in v.node or "shared" in v.node) for v in g.verified)


def test_the_graph_file_names_the_expert():
    lm = wrap_model(build_tiny_moe("mixtral"), random_weights=True)
    g = graph(lm, IDS, max_nodes=8, per_site=2, node_threshold=1.0, edge_threshold=1.0)
    f = graph_file(g)
    neurons = {n.node_id: n for n in g.nodes if n.node_type == "neuron"}
    assert neurons
    for node in f["nodes"]:
        if node["node_id"] in neurons:
            n = neurons[node["node_id"]]
            assert node["feature"] == n.index == n.expert * 48 + n.neuron  # d_expert 48
            assert f"E{n.expert} N{n.neuron}" in node["clerp"]


def test_a_recomputation_that_differs_from_the_module_fails(monkeypatch):
    """The recomputed MoE block must give the module's own output: a fault is a Mismatch."""
    lm = wrap_model(build_tiny_moe("mixtral"), random_weights=True)
    real = graph_experts._output
    monkeypatch.setattr(graph_experts, "_output", lambda *a: real(*a) * 1.001)
    with pytest.raises(Mismatch, match="mixture of experts"):
        graph(lm, IDS, max_nodes=4, per_site=2)


def test_experts_it_cannot_freeze_are_refused_in_one_line():
    """Experts without a gate (transformers' has_gate False: act(up) alone) are refused."""
    lm = wrap_model(build_tiny_moe("mixtral"), random_weights=True)
    for mlp in lm.parts.mlps:
        mlp.experts.has_gate = False
    with pytest.raises(BadInput, match="cannot freeze") as e:
        graph(lm, IDS)
    assert "\n" not in str(e.value)


def test_the_frozen_pass_holds_only_the_chosen_experts_neurons():
    """The backward passes carry, per MoE block, the neurons of the experts the router chose
    somewhere in the pass and the shared experts' (the others are 0 everywhere)."""
    lm = wrap_model(build_tiny_moe("deepseek_v3"), random_weights=True)
    model, parts = graph_core.float64_copy(lm)
    sites = freezing.mlp_sites(parts.family)
    ids = IDS[:2]
    clean = _clean(model, parts, ids)
    with freezing.frozen(model, parts, sites) as p:
        model(torch.tensor([ids]), use_cache=False)
    assert sorted(p.columns) == sorted(clean["route"]) == [1, 2]
    for layer, cols in p.columns.items():
        E, two_i, _ = parts.mlps[layer].experts.gate_up_proj.shape
        I = two_i // 2
        chosen = sorted(set(clean["route"][layer][0].flatten().tolist()))
        assert len(chosen) < E
        want = [e * I + n for e in chosen for n in range(I)] + \
            list(range(E * I, E * I + parts.mlps[layer].shared_experts.up_proj.out_features))
        assert cols.tolist() == want
        assert p.leaves[layer].shape[-1] == len(want)
        full = clean["a"][layer]  # (T, width)
        torch.testing.assert_close(p.acts[layer][0].detach(), full[:, cols], rtol=1e-12,
                                   atol=0.0)
        assert float(full.abs().sum()) == pytest.approx(float(full[:, cols].abs().sum()))
