"""`fptrace graph` on gpt-oss: its attention sinks and its clamped, biased experts, against the
model itself. Written here from transformers' own modules (a float64 copy of the model run
eagerly, hooks on its router and experts, the experts' own `_apply_gate`): the frozen pattern
with its sinks equals the model's own attention weights (output_attentions) at every position,
sliding-window and full; every expert neuron's value, and its incoming edges plus bias terms,
equal (clamp(up) + 1) · glu(min(gate, limit)) recomputed from the MLP's input; the logits equal
the model's; an edge from a block-0 neuron into a later position's block-1 neuron (through the
held pattern with its sinks) and into a logit equals an intervention replayed here with the
patterns, norm scales, routing, gates and clamps held; a clamped neuron is all bias terms, no
incoming edge; --verify, the recomputed-pattern path, transcoders and the command line."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_moe, forward_then_remove, make_moe_folder, replay
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.graph import core as graph_core
from fptrace.commands.graph import freezing
from fptrace.commands.graph.core import graph
from fptrace.commands.graph.examples import write_transcoders
from fptrace.core.dictionaries import read_dictionary
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 9, 311]  # 6 positions: block 0's window of 4 cuts the first ones off
LIMIT = 0.2  # a swiglu_limit that clamps a good share of the tiny model's pre-activations
runner = CliRunner()


def _model(limit: float | None = None):
    """The tiny gpt-oss (block 0 sliding, block 1 full attention) with biases and sinks that
    matter: random init leaves the experts' biases at 0 and the sinks small."""
    m = build_tiny_moe("gpt_oss", **({} if limit is None else {"swiglu_limit": limit}))
    with torch.no_grad():
        for layer in m.model.layers:
            ex = layer.mlp.experts
            for b in (ex.gate_up_proj_bias, ex.down_proj_bias):
                b.copy_(torch.randn_like(b) * 0.1)
            layer.self_attn.sinks.copy_(torch.randn_like(layer.self_attn.sinks) + 1.0)
    return wrap_model(m, name="tiny-gpt_oss", random_weights=True)


@pytest.fixture(scope="module", params=[None, LIMIT], ids=["limit7", "limit0.2"])
def made(request):
    """(the tiny gpt-oss, its graph with every node and edge kept)."""
    lm = _model(request.param)
    return lm, graph(lm, IDS, max_nodes=24, per_site=4, node_threshold=1.0, edge_threshold=1.0)


def _rms(m, x, gain=None):
    """GptOssRMSNorm in float64 (the module computes in float32): weight · x / √(mean x² + ε),
    or x · gain with the gain held."""
    if gain is None:
        gain = m.weight * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon)
    return x * gain, gain


def _experts(ex, x, idx):
    """From the experts' own tensors and `_apply_gate`: at each position, each chosen expert's
    gate_up = x · gate_up_proj[e] + bias (interleaved: gate the even, up the odd columns); its
    activations (T, E·I) ((up clamped + 1) · glu(gate capped)), up pre-activations (T, E·I),
    gate factor glu(min(gate, limit)) (T, E·I), 0 where the expert was not chosen."""
    E, I = ex.num_experts, ex.intermediate_size
    a, u, r = (torch.zeros(x.shape[0], E, I, dtype=x.dtype) for _ in range(3))
    for t in range(x.shape[0]):
        for e in idx[t].tolist():
            gu = x[t] @ ex.gate_up_proj[e] + ex.gate_up_proj_bias[e]  # (2I,)
            a[t, e] = ex._apply_gate(gu[None])[0]
            u[t, e] = gu[1::2]
            g = gu[::2].clamp(max=ex.limit)
            r[t, e] = g * torch.sigmoid(g * ex.alpha)
    return a.reshape(len(x), -1), u.reshape(len(x), -1), r.reshape(len(x), -1)


def _moe_out(ex, a, idx, w):
    """(T, d): Σ over each position's chosen experts of w · (a_e · down_proj[e] + its bias)."""
    I = ex.intermediate_size
    y = torch.zeros(a.shape[0], ex.hidden_size, dtype=a.dtype)
    for t in range(a.shape[0]):
        for e, v in zip(idx[t].tolist(), w[t].tolist(), strict=True):
            y[t] += v * (a[t, e * I:(e + 1) * I] @ ex.down_proj[e] + ex.down_proj_bias[e])
    return y


def _clean(model, ids):
    """The float64 model run eagerly (transformers' own gpt-oss attention, its sinks) with
    output_attentions and its norms in float64: each block's pattern, MLP input, router choice,
    expert activations, up pre-activations and gate factors, norm gains, and the last logits."""
    got = {"x": {}, "route": {}, "gain": {}}
    handles = []
    for i, layer in enumerate(model.model.layers):
        handles.append(layer.mlp.register_forward_pre_hook(
            lambda m, a, i=i: got["x"].__setitem__(i, a[0][0].clone())))
        handles.append(layer.mlp.router.register_forward_hook(
            lambda m, a, o, i=i: got["route"].__setitem__(i, (o[2].clone(), o[1].clone()))))
    for name, m in model.named_modules():
        if type(m).__name__ == "GptOssRMSNorm":
            def norm(m, a, o, name=name):
                y, got["gain"][name] = _rms(m, a[0])
                return y
            handles.append(m.register_forward_hook(norm))
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(torch.tensor([ids]), use_cache=False, output_attentions=True)
    finally:
        model.set_attn_implementation(before)
        for h in handles:
            h.remove()
    got["patterns"] = [p[0] for p in out.attentions]  # (nh, T, T) each
    got["logits"] = out.logits[0, -1]
    got["a"], got["u"], got["r"] = {}, {}, {}
    for i, layer in enumerate(model.model.layers):
        got["a"][i], got["u"][i], got["r"][i] = _experts(layer.mlp.experts, got["x"][i],
                                                         got["route"][i][0])
    return got


def _edges_in(g, node_id):
    return sum(e.weight for e in g.edges if e.target == node_id)


def test_the_pattern_with_sinks_is_the_models_own():
    """The frozen pass's pattern (held, and recomputed from its held q, k, mask and sinks)
    equals the model's own eager attention weights at every query and key, in both the sliding
    block and the full one; the sinks take a share of every row."""
    lm = _model()
    model, parts = graph_core.float64_copy(lm)
    clean = _clean(model, IDS)
    with freezing.frozen(model, parts, freezing.mlp_sites(parts.family), outputs=True) as p:
        model(torch.tensor([IDS]), use_cache=False)
    for layer, want in enumerate(clean["patterns"]):
        got = freezing.frozen_pattern(*p.patterns[layer])[0]  # (nh, T, T)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
        assert float(got.sum(-1).max()) < 0.99  # the sink's column is dropped
    window = model.config.sliding_window
    assert model.config.layer_types[0] == "sliding_attention"
    T = len(IDS)
    for q in range(T):
        for k in range(T):
            seen = k <= q and (q - k < window)
            assert (float(clean["patterns"][0][:, q, k].abs().max()) > 0) == seen
            assert (float(clean["patterns"][1][:, q, k].abs().max()) > 0) == (k <= q)
    with torch.no_grad():  # the model in its own float32, eager: to its rounding
        own = lm.model
        before = own.config._attn_implementation
        own.set_attn_implementation("eager")
        try:
            f32 = own(torch.tensor([IDS]), use_cache=False, output_attentions=True).attentions
        finally:
            own.set_attn_implementation(before)
    for layer, want in enumerate(f32):
        torch.testing.assert_close(clean["patterns"][layer], want[0].double(), rtol=1e-5,
                                   atol=1e-6)


def test_every_node_sums_to_the_model_own_values(made):
    """Each expert neuron's value, and its incoming edges plus bias terms, equal the experts'
    own activation recomputed here; each logit node the model's own logit; a clamped neuron (u
    beyond ±limit) is a constant under the freezing: never a node, what it writes a bias term
    of the nodes it reaches (which still sum)."""
    lm, g = made
    assert g.ok and g.checks[0].name == "graph_sums" and g.checks[0].value < 1e-12
    model, _ = graph_core.float64_copy(lm)
    clean = _clean(model, IDS)
    limit = model.model.layers[0].mlp.experts.limit
    neurons = [n for n in g.nodes if n.node_type == "neuron"]
    assert len(neurons) >= 8
    for n in neurons:
        want = float(clean["a"][n.layer][n.position, n.index])
        assert want != 0.0 and n.expert in clean["route"][n.layer][0][n.position].tolist()
        assert n.value == pytest.approx(want, rel=1e-9)
        assert _edges_in(g, n.node_id) + n.bias == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert abs(float(clean["u"][n.layer][n.position, n.index])) <= limit  # not clamped
    clamped = sum(int(((clean["u"][i].abs() > limit) & (clean["a"][i] != 0)).sum())
                  for i in clean["u"])
    said = [n for n in g.notes if "clamped beyond" in n]
    if limit == LIMIT:  # many are; among the largest |a| (what makes a candidate)
        assert clamped > 20 and any("clamp" in line for line in g.freezing)
        assert len(said) == 1 and said[0].startswith(f"{clamped} of the chosen experts' neurons")
        for i in clean["u"]:
            for t in range(len(IDS)):
                top = clean["a"][i][t].abs().topk(4).indices
                assert (clean["u"][i][t, top].abs() > limit).any()
    else:
        assert clamped == 0 and not said
    assert any("sink" in line for line in g.freezing)
    for n in (n for n in g.nodes if n.node_type == "logit"):
        want = float(clean["logits"][n.index])
        assert n.value == pytest.approx(want, rel=1e-9)
        assert _edges_in(g, n.node_id) + n.bias == pytest.approx(want, rel=1e-9, abs=1e-12)


def _replayed(model, ids, clean):
    """run(source, delta) -> each block's expert activations (T, E·I) and the last logits, in
    a forward pass written here: every attention's output its clean pattern (the model's own,
    sinks included) times its values, every norm's gain held, the router's choice and weights
    held, each neuron's gate factor and clamp held (a = r · (u + 1) where the clean u is within
    ±limit, else its clean value), and every neuron's activation entering the down projection
    held at its clean value (source's moved by delta)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    def attend(module, q, k, v, mask, scaling=None, dropout=0.0, **kw):
        pattern = clean["patterns"][module.layer_idx][None]  # (1, nh, T, T)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        return (pattern @ v).transpose(1, 2).contiguous(), pattern

    AttentionInterface.register("test-gpt-oss-replay", attend)
    AttentionMaskInterface.register("test-gpt-oss-replay", eager_mask)

    def run(source=None, delta=0.0):
        out, handles = {}, []
        for name, m in model.named_modules():
            if type(m).__name__ == "GptOssRMSNorm":
                handles.append(m.register_forward_hook(
                    lambda m, a, o, name=name: _rms(m, a[0], clean["gain"][name])[0]))
        for i, layer in enumerate(model.model.layers):
            ex = layer.mlp.experts
            held = clean["a"][i].clone()
            if source is not None and source[0] == i:
                held[source[1], source[2]] += delta

            def moe(m, a, o, i=i, ex=ex, held=held):
                x = a[0][0]
                idx, w = clean["route"][i]
                _, u, _ = _experts(ex, x, idx)
                inside = clean["u"][i].abs() <= ex.limit
                out[i] = torch.where(inside, clean["r"][i] * (u + 1), clean["a"][i])
                return (_moe_out(ex, held, idx, w)[None], o[1])
            handles.append(layer.mlp.register_forward_hook(moe))
        out["logits"] = replay(model, ids, handles, "test-gpt-oss-replay").logits[0, -1]
        return out
    return run


def test_an_edge_through_a_pattern_with_sinks_is_an_intervention(made):
    """Moving a block-0 expert neuron's activation by delta, everything else held (replayed
    here), moves a later position's block-1 neuron (through block 1's held pattern, sinks
    included) and the logits by exactly edge / activation × delta."""
    lm, g = made
    by_id = {n.node_id: n for n in g.nodes}
    pairs = [(by_id[e.source], by_id[e.target], e.weight) for e in g.edges
             if by_id[e.source].node_type == "neuron" and by_id[e.source].layer == 0
             and by_id[e.target].node_type in ("neuron", "logit") and abs(e.weight) > 1e-6]
    later = sorted([p for p in pairs if p[1].node_type == "neuron"
                    and p[1].position > p[0].position], key=lambda p: -abs(p[2]))
    logit = sorted([p for p in pairs if p[1].node_type == "logit"], key=lambda p: -abs(p[2]))
    assert later and logit
    model, _ = graph_core.float64_copy(lm)
    clean = _clean(model, IDS)
    run = _replayed(model, IDS, clean)
    base = run()
    assert float(base["logits"].sub(clean["logits"]).abs().max()) < 1e-12  # the replay is exact

    def value(out, t):
        return float(out["logits"][t.index] if t.node_type == "logit"
                     else out[t.layer][t.position, t.index])

    for s, t, w in later[:3] + logit[:2]:
        assert value(base, t) == pytest.approx(t.value, rel=1e-9)
        delta = 0.5 * s.value
        moved = run((s.layer, s.position, s.index), delta)
        assert value(moved, t) - value(base, t) == pytest.approx(w / s.value * delta, rel=1e-8,
                                                                 abs=1e-12)


def test_the_router_choice_shown_is_the_routers_own(made):
    lm, g = made
    model, _ = graph_core.float64_copy(lm)
    clean = _clean(model, IDS)
    assert g.routes
    for r in g.routes:
        idx, w = clean["route"][r.layer]
        pairs = dict(zip(idx[r.position].tolist(), w[r.position].tolist(), strict=True))
        assert set(r.experts) == set(pairs) and r.shared_gate is None
        for e, v in zip(r.experts, r.weights, strict=True):
            assert v == pytest.approx(pairs[e], rel=1e-12)


def test_verify_and_the_recomputed_patterns(monkeypatch):
    """--verify holds every edge on gpt-oss (clamped neurons among the nodes); the pass that
    recomputes each block's pattern (long prompts) gives the same graph as the held one."""
    lm = _model(LIMIT)
    g = graph(lm, IDS, max_nodes=12, per_site=3, verify=3)
    assert g.ok and [c.name for c in g.checks] == ["graph_sums", "graph_model", "graph_heads",
                                                   "graph_verify"]
    assert g.checks[-1].value < 1e-8 and len(g.verified) == 3
    assert all(" E" in v.node for v in g.verified)
    held = graph(lm, IDS, max_nodes=10, per_site=2)
    monkeypatch.setattr(freezing, "HELD_PATTERNS_BYTES", 0)
    recomputed = graph(lm, IDS, max_nodes=10, per_site=2)
    assert recomputed.ok
    assert [n.node_id for n in held.nodes] == [n.node_id for n in recomputed.nodes]
    for x, y in zip(held.edges, recomputed.edges, strict=True):
        assert (x.source, x.target) == (y.source, y.target)
        assert x.weight == pytest.approx(y.weight, rel=1e-12, abs=1e-15)


def test_transcoders_on_gpt_oss(tmp_path):
    """--transcoders: each block's MLP (router and experts) replaced, the experts inside the
    error; the latents against their transcoders on the real MLP input, the logits the
    model's."""
    lm = _model(LIMIT)
    L, d = lm.config.num_hidden_layers, lm.config.hidden_size
    folder = write_transcoders(str(tmp_path / "tc"), range(L), d, 48, k=8)
    g = graph(lm, IDS, transcoders=folder, max_nodes=16, per_site=3, node_threshold=1.0,
              edge_threshold=1.0, verify=2)
    assert g.ok and g.checks[0].value < 1e-9, g.checks
    got, handles = {}, []
    for i, mlp in enumerate(lm.parts.mlps):
        handles.append(mlp.register_forward_hook(
            lambda m, a, o, i=i: got.__setitem__(i, a[0][0].double())))
    handles.append(lm.parts.lm_head.register_forward_hook(
        lambda m, a, o: got.__setitem__("logits", o[0, -1].double())))
    forward_then_remove(lm, IDS, handles)
    latents = [n for n in g.nodes if n.node_type == "latent"]
    assert latents and any(n.node_type == "error" for n in g.nodes)
    for n in latents:
        tc = read_dictionary(f"{folder}/layer_{n.layer}")
        want = tc.encode(got[n.layer][n.position:n.position + 1].float())[0, n.index]
        assert n.value == pytest.approx(float(want), rel=1e-4, abs=1e-6)
    for n in (n for n in g.nodes if n.node_type == "logit"):
        assert n.value == pytest.approx(float(got["logits"][n.index]), rel=1e-5, abs=1e-5)
    assert any("sink" in line for line in g.freezing)


def test_the_command_line(tmp_path):
    """`fptrace graph --neurons` on a gpt-oss folder: exit 0, the freezing says what it holds
    for the sinks and the experts, the checks pass."""
    folder, _ = make_moe_folder(tmp_path, "gpt_oss")
    r = runner.invoke(app, ["graph", "The cat sat on the mat", "-m", str(folder), "--neurons",
                            "--max-nodes", "8", "--verify", "1"])
    assert r.exit_code == 0, r.output
    assert "sink" in r.stdout and "clamp" in r.stdout and "✓ exact" in r.stdout


def test_heads_and_qk_read_the_pattern_with_sinks():
    """The split of the edges over heads and --qk read the same pattern: each --qk entry's
    frozen weight equals the model's own eager attention weight with its sinks (the float64
    copy's to 1e-12, the model's float32 one, which --qk reports beside it, to its rounding),
    and each kept edge's split over heads sums to the edge (graph_heads)."""
    lm = _model()
    g = graph(lm, IDS, max_nodes=12, per_site=3, qk=3)
    assert g.ok and [c.name for c in g.checks] == ["graph_sums", "graph_model", "graph_heads",
                                                   "graph_qk"]
    assert g.qk
    model, _ = graph_core.float64_copy(lm)
    clean = _clean(model, IDS)
    for q in g.qk:
        want = float(clean["patterns"][q.layer][q.head, q.query, q.key])
        assert q.pattern == pytest.approx(want, rel=1e-12)
        assert q.weight == pytest.approx(want, rel=1e-5)
