"""`fptrace graph --transcoders DIR`: each block's MLP replaced by its transcoder plus an error
node per (block, position). Exact on a Llama-like, a GPT-2-like and a mixture-of-experts model
(the router and experts inside the error) against the real model's hooks and logits; a block
without a transcoder is all error, and said; a wrong latent activation fails the check; the
graph file names the error nodes as circuit-tracer does; bad inputs."""

from __future__ import annotations

import json

import pytest
from conftest import build_tiny, forward_then_remove, tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.graph import freezing
from fptrace.commands.graph.core import graph
from fptrace.commands.graph.examples import write_transcoder, write_transcoders
from fptrace.core.dictionaries import read_dictionary
from fptrace.errors import BadInput
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 9, 311]
runner = CliRunner()


def _lm(family):
    return wrap_model(build_tiny(family), name=f"tiny-{family}", random_weights=True)


def _real(lm, ids):
    """Each block's MLP input and output and the LM head's last row, read by hooks on the real
    (float32) model's own modules."""
    got, handles = {}, []
    for i, mlp in enumerate(lm.parts.mlps):
        handles.append(mlp.register_forward_hook(lambda m, a, o, i=i: got.__setitem__(
            i, (a[0][0].double(), (o[0] if isinstance(o, tuple) else o)[0].double()))))
    handles.append(lm.parts.lm_head.register_forward_hook(
        lambda m, a, o: got.__setitem__("logits", o[0, -1].double())))
    forward_then_remove(lm, ids, handles)
    return got


@pytest.mark.parametrize("family", ["llama", "gpt2", "mixtral"])
def test_every_node_sums_to_the_real_model(family, tmp_path):
    lm = _lm(family)
    L, d = lm.config.num_hidden_layers, lm.config.hidden_size
    folder = write_transcoders(str(tmp_path / "tc"), range(L), d, 48, k=8)
    g = graph(lm, IDS, transcoders=folder, max_nodes=16, per_site=3, node_threshold=1.0,
              edge_threshold=1.0)
    assert g.ok and g.checks[0].value < 1e-9, g.checks
    assert g.transcoders == folder and g.missing_blocks == ()
    real = _real(lm, IDS)
    latents = [n for n in g.nodes if n.node_type == "latent"]
    assert latents
    for n in latents:  # each latent's value: its transcoder's activation of the real MLP input
        tc = read_dictionary(f"{folder}/layer_{n.layer}")
        want = tc.encode(real[n.layer][0][n.position:n.position + 1].float())[0, n.index]
        assert n.value == pytest.approx(float(want), rel=1e-4, abs=1e-6)
    for n in (n for n in g.nodes if n.node_type == "logit"):
        assert n.value == pytest.approx(float(real["logits"][n.index]), rel=1e-5, abs=1e-5)
    errors = [n for n in g.nodes if n.node_type == "error"]
    assert errors and max(n.influence for n in errors) > 0  # random transcoders miss a lot
    assert 0 < g.scores.replacement < 1 and 0 < g.scores.completeness < 1
    # the transcoders here reconstruct badly: the error is most of each MLP output, so an edge
    # through it is real, and leaving it out would not sum (what the check above holds)
    tc = read_dictionary(f"{folder}/layer_0")
    x, y = real[0]
    miss = y.float() - tc.decode(tc.encode(x.float()))
    assert float(miss.norm()) > 0.1 * float(y.norm())


def test_every_candidate_computed_unranked_is_the_ranked_graph(tmp_path):
    """Where max_nodes covers every candidate, each one's row is computed without ranking: the
    candidates are the per_site largest latents that fire (read from the real model's MLP
    inputs), every row sums exactly, and the pruned graph and its scores equal those of the
    ranked path (max_nodes one short: it computes only the latents with influence, leaving out
    the last block's latents before the query, which reach no logit)."""
    lm = _lm("llama")
    L, d = lm.config.num_hidden_layers, lm.config.hidden_size
    folder = write_transcoders(str(tmp_path / "tc"), range(L), d, 48, k=8)
    real = _real(lm, IDS)
    firing = sum(min(3, int((read_dictionary(f"{folder}/layer_{layer}").encode(
        real[layer][0].float()) != 0).sum(-1)[pos])) for layer in range(L)
        for pos in range(len(IDS)))
    every = graph(lm, IDS, transcoders=folder, max_nodes=10_000, per_site=3)
    assert every.ok and every.checks[0].value < 1e-9, every.checks
    assert every.candidates == every.computed == firing
    ranked = graph(lm, IDS, transcoders=folder, max_nodes=firing - 1, per_site=3)
    assert ranked.ok and ranked.computed < firing - 1  # those without influence left out
    assert [n.node_id for n in ranked.nodes] == [n.node_id for n in every.nodes]
    for a, b in zip(ranked.scores.__dict__.values(), every.scores.__dict__.values(),
                    strict=True):
        assert a == pytest.approx(b, rel=1e-12)
    assert {(e.source, e.target): e.weight for e in ranked.edges} == pytest.approx(
        {(e.source, e.target): e.weight for e in every.edges}, rel=1e-12)


def test_a_block_without_a_transcoder_is_all_error_and_said(tmp_path):
    lm = _lm("llama")
    folder = write_transcoders(str(tmp_path / "tc"), [0], lm.config.hidden_size)
    g = graph(lm, IDS, transcoders=folder, max_nodes=8)
    assert g.ok and g.missing_blocks == (1, 2)
    assert any("2 of the 3 blocks have no transcoder (1-2)" in n for n in g.notes), g.notes
    assert not any(n.node_type == "latent" and n.layer != 0 for n in g.nodes)


def test_a_wrong_latent_activation_fails_the_check(monkeypatch, tmp_path):
    lm = _lm("llama")
    folder = write_transcoders(str(tmp_path / "tc"), range(3), lm.config.hidden_size)
    real_hook = freezing.replacement_hook

    def wrong(state, layer, tc):
        hook = real_hook(state, layer, tc)

        def changed(module, args, output):
            out = hook(module, args, output)
            if layer in state.acts:
                state.acts[layer] = state.acts[layer] * 1.001  # r off by 0.1 %
            return out
        return changed

    monkeypatch.setattr(freezing, "replacement_hook", wrong)
    g = graph(lm, IDS, transcoders=folder, max_nodes=4, per_site=2)
    assert not g.ok and not g.checks[0].ok and " T" in g.checks[0].worst


def test_the_command_line_and_the_graph_file(tmp_path):
    folder = tiny_gpt2()
    d = json.loads(open(f"{folder}/config.json").read())["n_embd"]
    tc = write_transcoders(str(tmp_path / "tc"), range(2), d)
    out = tmp_path / "g.json"
    r = runner.invoke(app, ["graph", "The cat sat on the", "-m", folder, "--transcoders", tc,
                            "--max-nodes", "6", "--graph-json", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["transcoders"] == tc and doc["missing_blocks"] == []
    f = json.loads(out.read_text())
    assert f["metadata"]["transcoder_list"] == [tc]
    types = {n["feature_type"] for n in f["nodes"]}
    assert "mlp reconstruction error" in types and "embedding" in types
    view = runner.invoke(app, ["graph", "The cat sat on the", "-m", folder, "--transcoders", tc,
                               "--max-nodes", "6"])
    assert view.exit_code == 0 and "latents computed" in view.stdout
    assert "over the transcoders' error nodes" in view.stdout


@pytest.mark.parametrize("make, says", [
    (lambda root, d: write_transcoder(f"{root}/x/layer_0", 0, d, 16,
                                      architecture="standard").rsplit("/", 1)[0],
     "not a transcoder"),
    (lambda root, d: write_transcoder(f"{root}/x/layer_0", 0, d + 8, 16).rsplit("/", 1)[0],
     "another model"),
    (lambda root, d: (write_transcoder(f"{root}/x/a", 1, d, 16),
                      write_transcoder(f"{root}/x/b", 1, d, 16))[0].rsplit("/", 1)[0],
     "two transcoders for block 1"),
    (lambda root, d: write_transcoder(f"{root}/x/layer_9", 9, d, 16).rsplit("/", 1)[0],
     "has blocks 0 to 1"),
])
def test_bad_transcoders_are_one_line_exit_2(make, says, tmp_path):
    folder = tiny_gpt2()
    d = json.loads(open(f"{folder}/config.json").read())["n_embd"]
    out = tmp_path / "g.json"
    r = runner.invoke(app, ["graph", "The cat sat", "-m", folder, "--transcoders",
                            make(str(tmp_path), d), "--graph-json", str(out)])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("fptrace: error")]
    assert len(errors) == 1 and says in errors[0], r.stderr
    assert not out.exists()


def test_a_transcoder_the_reader_refuses_is_named_by_the_option_that_gave_it(tmp_path):
    """The dictionary reader's refusals name --transcoders under graph (not features' --sae),
    and --transcoder under features."""
    (tmp_path / "layer_0").mkdir()
    (tmp_path / "layer_0" / "cfg.json").write_text("{}")
    r = runner.invoke(app, ["graph", "The cat sat", "-m", tiny_gpt2(), "--transcoders",
                            str(tmp_path)])
    error = [line for line in r.stderr.splitlines() if line.startswith("fptrace: error")]
    assert r.exit_code == 2 and error[0].startswith(
        f"fptrace: error: --transcoders '{tmp_path}/layer_0': no dictionary there"), r.stderr
    r = runner.invoke(app, ["features", "The cat sat", "-m", tiny_gpt2(), "--transcoder",
                            str(tmp_path / "layer_0")])
    assert r.exit_code == 2 and r.stderr.startswith("fptrace: error: --transcoder '"), r.stderr


def test_neurons_and_transcoders_are_one_or_the_other(tmp_path):
    r = runner.invoke(app, ["graph", "x", "--neurons", "--transcoders", str(tmp_path)])
    assert r.exit_code == 2 and "pass one" in r.stderr
    r = runner.invoke(app, ["graph", "x", "--transcoders", str(tmp_path / "gone")])
    assert r.exit_code == 2 and "no such folder" in r.stderr
    with pytest.raises(BadInput, match="no transcoder there"):
        graph(_lm("llama"), IDS, transcoders=str(tmp_path))


@pytest.mark.parametrize("extra, read, max_nodes", [
    ((), "", "6"),  # fptrace's own layout (SAELens's), one folder a block
    (("--skip", "--export", "circuit-tracer"), "circuit-tracer", "40"),  # skip, circuit-tracer's
])
def test_transcoders_fptrace_trains_are_graphed(tmp_path, extra, read, max_nodes):
    """`features train --transcoder --layers all` writes what `graph --transcoders` reads: the
    graph over them is exact, no block is left without a transcoder and its latents are
    theirs; so with `--skip --export circuit-tracer`, the export's folder read (its JumpReLU
    export FVU read back is in test_features_train.py)."""
    folder = tiny_gpt2()
    prompts = tmp_path / "p.txt"
    prompts.write_text("The cat sat on the mat and looked at the dog.\n"
                       "A bird flew over the house in the morning light.\n"
                       "The capital of France is Paris and it is big.\n")
    out = tmp_path / "tc"
    r = runner.invoke(app, ["features", "train", "--transcoder", "--layers", "all", str(prompts),
                            "-m", folder, "--out", str(out), "--latents", "64", "--k", "8",
                            "--tokens", "1024", *extra])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["graph", "The cat sat on the", "-m", folder, "--transcoders",
                            str(out / read), "--max-nodes", max_nodes, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["missing_blocks"] == []
    assert any(n["node_type"] == "latent" and 0 <= n["index"] < 64 for n in doc["nodes"])


# ---- skip transcoders: the skip term x·W_skip a linear path -------------------------------

@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_skip_transcoders_keep_every_check_and_split_their_edges(family, tmp_path):
    """With a random W_skip in every block's transcoder the graph still sums exactly (edges +
    bias = value, float64), its logits are the model's, every kept edge is direct + heads +
    skip, --verify's interventions agree with the edges, and the freezing says the skip is a
    linear path."""
    lm = _lm(family)
    L, d = lm.config.num_hidden_layers, lm.config.hidden_size
    folder = write_transcoders(str(tmp_path / "tc"), range(L), d, 48, k=8, skip=0.5)
    assert read_dictionary(f"{folder}/layer_0").W_skip is not None
    g = graph(lm, IDS, transcoders=folder, max_nodes=16, per_site=3, node_threshold=1.0,
              edge_threshold=1.0, verify=4)
    assert g.ok, g.checks
    assert {c.name for c in g.checks} >= {"graph_sums", "graph_model", "graph_heads",
                                          "graph_verify"}
    assert all(c.value < 1e-8 for c in g.checks if c.name != "graph_model"), g.checks
    assert freezing.SKIP_FREEZING in g.freezing
    for e in g.edges:
        assert e.skip is not None
        parts = e.direct + sum(h.share for h in e.heads) + e.heads_rest + e.skip
        assert parts == pytest.approx(e.weight, rel=1e-6, abs=1e-9)
    assert any(abs(e.skip) > 1e-3 * abs(e.weight) > 0 for e in g.edges)


def test_an_edge_through_a_skip_is_the_hand_computed_one(tmp_path):
    """A tiny Llama whose attention writes nothing (o_proj zero), on a prompt of one token: the
    edge from its embedding to a latent of block 1 runs along two paths only, the
    stream itself and block 0's skip term (its latents and error are leaves), so with each
    RMSNorm's scale g = γ / √(mean h² + ε) read here from the real model's norm inputs, the
    edge is e · (g1 ⊙ w) + e · (g0 ⊙ (W_skip0 (g1 ⊙ w))), e the embedding and w the latent's
    encoder column, W_skip0 applied as x @ W_skip0."""
    import torch

    lm = _lm("llama")
    with torch.no_grad():
        for layer in lm.model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    L, d = lm.config.num_hidden_layers, lm.config.hidden_size
    folder = write_transcoders(str(tmp_path / "tc"), range(L), d, 48, k=8, skip=0.5)
    ids = IDS[:1]
    g = graph(lm, ids, transcoders=folder, max_nodes=64, per_site=8, node_threshold=1.0,
              edge_threshold=1.0)
    assert g.ok, g.checks
    norms, got = [lm.model.model.layers[i].post_attention_layernorm for i in (0, 1)], {}
    handles = [n.register_forward_pre_hook(lambda m, a, i=i: got.__setitem__(
        i, a[0][0, 0].double())) for i, n in enumerate(norms)]
    forward_then_remove(lm, ids, handles)

    def gain(i):
        n = norms[i]
        return n.weight.detach().double() / torch.sqrt((got[i] ** 2).mean() + n.variance_epsilon)

    t0, t1 = read_dictionary(f"{folder}/layer_0"), read_dictionary(f"{folder}/layer_1")
    emb = lm.model.model.embed_tokens.weight[IDS[0]].detach().double()
    source = f"E_{IDS[0]}_0"
    found = [(e, n) for e in g.edges for n in g.nodes
             if e.source == source and e.target == n.node_id and n.node_type == "latent"
             and n.layer == 1 and n.position == 0]
    assert found, "no edge from the first token to a block-1 latent at position 0"
    for e, n in found:
        w = t1.W_enc[:, n.index].double()
        through_stream = float(emb @ (gain(1) * w))
        through_skip = float(emb @ (gain(0) * (t0.W_skip.double() @ (gain(1) * w))))
        assert e.weight == pytest.approx(through_stream + through_skip, rel=1e-6, abs=1e-9)
        assert e.skip == pytest.approx(through_skip, rel=1e-6, abs=1e-9)
        assert abs(through_skip) > 1e-2 * abs(through_stream)  # the skip path matters here
