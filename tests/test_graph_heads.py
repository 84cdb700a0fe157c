"""`fptrace graph`: heads on edges and --qk.

Each kept edge's split over attention heads held against an intervention computed here from
the model's own weights: in the frozen float64 model (patterns, norm scales and every neuron
held: freezing.Replay with hold), the source's vector taken out of one query head's values at
the source's position at one block (through the norm frozen at the stream a hook reads and the
model's own W_V, times the pattern column the model's eager attention returns) moves the
target by minus that head's share. On a grouped-query Llama (2 query heads per K/V head), a
Qwen2 (q/k/v biases) and GPT-2 (LayerNorm, Conv1D, biases, a learned position embedding).
A broken split fails the check (exit 5); --qk against the model's own attention weights."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.graph import core as graph_core
from fptrace.commands.graph import freezing, heads
from fptrace.commands.graph.core import graph
from fptrace.core.hooks import eager_attention
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 9, 311]
FAMILIES = ("llama", "qwen2", "gpt2")
runner = CliRunner()


@pytest.fixture(scope="module", params=FAMILIES)
def made(request):
    lm = wrap_model(build_tiny(request.param), name=f"tiny-{request.param}",
                    random_weights=True)
    return lm, graph(lm, IDS, max_nodes=12, per_site=3, node_threshold=1.0, edge_threshold=1.0)


def _block_parts(lm, model, layer):
    """(the norm before attention, W_V as (nkv·hd, d), n_heads, n_kv_heads, head_dim) of the
    float64 copy's block, from the model's own modules."""
    cfg = lm.config
    nh = cfg.num_attention_heads
    nkv = getattr(cfg, "num_key_value_heads", None) or nh
    if lm.parts.family.name == "gpt2":
        blk = model.transformer.h[layer]
        d = cfg.hidden_size
        return blk.ln_1, blk.attn.c_attn.weight[:, 2 * d:].T, nh, nkv, d // nh
    blk = model.model.layers[layer]
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // nh
    return blk.input_layernorm, blk.self_attn.v_proj.weight, nh, nkv, hd


def _frozen_norm(norm, x, w):
    """What the norm, frozen at the stream x (d,), makes of the vector w (d,) (no bias)."""
    if isinstance(norm, torch.nn.LayerNorm):
        return (w - w.mean()) * norm.weight / torch.sqrt(x.var(unbiased=False) + norm.eps)
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    return w * norm.weight / torch.sqrt((x * x).mean() + eps)


def _source_vector(lm, model, node):
    """The vector a token or a neuron writes into the stream, from the model's own weights."""
    if node.node_type == "embedding":
        return model.get_input_embeddings().weight[node.index]
    if lm.parts.family.name == "gpt2":
        return node.value * model.transformer.h[node.layer].mlp.c_proj.weight[node.index]
    return node.value * model.model.layers[node.layer].mlp.down_proj.weight[:, node.index]


def _intervened(lm, g, edge, head):
    """The target's change when the source's vector is taken out of head (layer, head)'s
    values at the source's position, everything else of the frozen model held."""
    model, parts = graph_core.float64_copy(lm)
    by_id = {n.node_id: n for n in g.nodes}
    src, tgt = by_id[edge.source], by_id[edge.target]
    layer, h, s = head.layer, head.head, src.position
    norm, W_V, nh, nkv, hd = _block_parts(lm, model, layer)
    stream = {}
    block = parts.blocks[layer]
    hook = block.register_forward_pre_hook(
        lambda m, a, kw: stream.__setitem__("x", (a[0] if a else kw["hidden_states"])[0]),
        with_kwargs=True)
    try:
        with torch.no_grad(), eager_attention(model):
            att = model(torch.tensor([IDS]), use_cache=False,
                        output_attentions=True).attentions[layer][0, h]  # (T, T)
    finally:
        hook.remove()
    kv = h // (nh // nkv)
    dv = W_V[kv * hd:(kv + 1) * hd] @ _frozen_norm(norm, stream["x"][s],
                                                   _source_vector(lm, model, src))  # (hd,)
    proj = parts.attns[layer].get_submodule(lm.parts.family.w_o[0])

    def take_out(module, args):
        z = args[0].clone()  # (2, T, nh·hd): row 1 without the source's vector in head h
        z[1, :, h * hd:(h + 1) * hd] -= att[:, s, None] * dv
        return (z, *args[1:])

    sites = freezing.mlp_sites(parts.family)
    queries = [len(IDS) - 1]
    handle = proj.register_forward_pre_hook(take_out)
    try:
        with torch.no_grad(), freezing.frozen(model, parts, sites,
                                              replay=freezing.Replay((None, None), True)) as p:
            model(torch.tensor([IDS, IDS]), use_cache=False,
                  logits_to_keep=torch.tensor(queries))
    finally:
        handle.remove()
    if tgt.node_type == "logit":
        v = p.logits[:, 0, tgt.index]
    else:
        v = p.acts[tgt.layer][:, tgt.position, tgt.index]
    return float(v[1] - v[0])


def test_the_split_sums_to_every_edge(made):
    g = made[1]
    check = next(c for c in g.checks if c.name == "graph_heads")
    assert g.ok and check.value < 1e-9
    for e in g.edges:
        assert e.direct is not None and e.heads_rest is not None
        total = e.direct + sum(h.share for h in e.heads) + e.heads_rest
        assert total == pytest.approx(e.weight, rel=1e-9, abs=1e-12)
        assert len(e.heads) <= graph_core.TOP_HEADS
    by_id = {n.node_id: n for n in g.nodes}
    for e in g.edges:  # a source at another position than its target reaches it only by heads
        if by_id[e.source].position != by_id[e.target].position:
            assert e.direct == 0.0


def test_a_head_share_is_the_intervention_it_claims(made):
    lm, g = made
    by_id = {n.node_id: n for n in g.nodes}
    pairs = sorted(((e, h) for e in g.edges for h in e.heads
                    if by_id[e.source].node_type in ("embedding", "neuron")),
                   key=lambda x: -abs(x[1].share))
    tokens = [x for x in pairs if by_id[x[0].source].node_type == "embedding"][:2]
    neurons = [x for x in pairs if by_id[x[0].source].node_type == "neuron"][:2]
    assert tokens and neurons
    for e, h in tokens + neurons:
        change = _intervened(lm, g, e, h)
        assert change == pytest.approx(-h.share, rel=1e-7, abs=1e-10), (e, h)


def test_grouped_query_heads_are_split_by_query_head():
    """The tiny Llama shares each K/V head between 2 query heads: their shares differ (each
    query head has its own pattern), and each matches its own intervention."""
    lm = wrap_model(build_tiny("llama"), random_weights=True)
    assert lm.config.num_key_value_heads < lm.config.num_attention_heads
    g = graph(lm, IDS, max_nodes=12, per_site=3, node_threshold=1.0, edge_threshold=1.0)
    by_id = {n.node_id: n for n in g.nodes}
    for e in g.edges:
        if by_id[e.source].node_type != "embedding":
            continue
        shares = {(h.layer, h.head): h.share for h in e.heads}
        pair = [(l, hh) for (l, hh) in shares if (l, hh ^ 1) in shares]  # one K/V head's two
        if pair:
            l, hh = pair[0]
            assert shares[(l, hh)] != shares[(l, hh ^ 1)]
            for head in (x for x in e.heads if (x.layer, x.head) in ((l, hh), (l, hh ^ 1))):
                assert _intervened(lm, g, e, head) == pytest.approx(-head.share, rel=1e-7,
                                                                    abs=1e-10)
            return
    pytest.fail("no token edge with both query heads of one K/V head among its top heads")


def test_a_broken_split_fails_the_check_and_exits_5(monkeypatch, tmp_path):
    real = heads.through_values
    monkeypatch.setattr(heads, "through_values",
                        lambda p, s, w: {k: (v * 1.01, row)
                                         for k, (v, row) in real(p, s, w).items()})
    lm = wrap_model(build_tiny("gpt2"), random_weights=True)
    g = graph(lm, IDS, max_nodes=6, per_site=2)
    check = next(c for c in g.checks if c.name == "graph_heads")
    assert not g.ok and not check.ok and check.value > 1e-5 and "->" in check.worst
    assert all(c.ok for c in g.checks if c.name != "graph_heads")  # the edges themselves hold
    from conftest import tiny_gpt2

    out = tmp_path / "g.json"
    r = runner.invoke(app, ["graph", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
                            "--neurons", "--max-nodes", "4", "--graph-json", str(out)])
    assert r.exit_code == 5 and "graph_heads" in r.stderr and not out.exists()


def test_qk_against_the_models_own_attention():
    lm = wrap_model(build_tiny("qwen2"), random_weights=True)
    g = graph(lm, IDS, max_nodes=12, per_site=3, node_threshold=1.0, edge_threshold=1.0, qk=3)
    check = next(c for c in g.checks if c.name == "graph_qk")
    assert g.ok and check.value < 1e-9 and 1 <= len(g.qk) <= 3
    shares = {(e.source, e.target, h.layer, h.head): h.share for e in g.edges for h in e.heads}
    picked = [abs(x.share) for x in g.qk]
    assert picked == sorted(picked, reverse=True)  # the largest shares first, ...
    for x in g.qk:  # ... each an edge's head share, read mostly after query 0
        assert shares[(x.source, x.target, x.layer, x.head)] == x.share and x.query > 0
    with torch.no_grad(), eager_attention(lm.model):
        att = lm.model(torch.tensor([IDS]), use_cache=False, output_attentions=True).attentions
    for x in g.qk:
        assert x.query >= x.key and all(c.ok for c in x.checks)
        own = float(att[x.layer][0, x.head, x.query, x.key])
        assert x.weight == pytest.approx(own, rel=1e-5, abs=1e-7)
        assert x.pattern == pytest.approx(own, rel=1e-4, abs=1e-6)  # the float64 pass's
        assert sum(t.value for t in x.top) + x.rest == pytest.approx(x.score, rel=1e-9)


@pytest.mark.parametrize("value", ["-1", "\u00b2", "2.5"])
def test_qk_bad_values_exit_2_with_one_line(value, tmp_path):
    from conftest import tiny_gpt2

    out = tmp_path / "g.json"
    r = runner.invoke(app, ["graph", "The cat sat", "-m", tiny_gpt2(), "--neurons",
                            "--graph-json", str(out), "--qk", value])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("fptrace: error")]
    assert len(errors) == 1 and "--qk" in errors[0]
    assert not out.exists()


def test_the_terminal_shows_the_heads_and_the_scores():
    import io

    from rich.console import Console

    from fptrace.commands.graph.render import graph_view

    lm = wrap_model(build_tiny("gpt2"), random_weights=True)
    g = graph(lm, IDS, max_nodes=8, per_site=2, qk=2)
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(graph_view(g, 80))
    text = out.getvalue()
    assert "Edges through attention heads" in text and "Why the heads attend there" in text
    top = max((e for e in g.edges if e.heads), key=lambda e: abs(e.weight - (e.direct or 0)))
    assert f"{top.weight:+.3f}" in text and f"L{top.heads[0].layer}.H{top.heads[0].head}" in text
    assert "split over heads sums to the edge" in text
