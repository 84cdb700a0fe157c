"""circuit-tracer's transcoder sets (config.yaml + layer_L.safetensors) read by `graph
--transcoders` and, one layer file at a time, by `features --transcoder`: a hand-written set
(JumpReLU with a threshold that matters, ReLU, W_skip) rebuilds what this test computes by hand,
as circuit-tracer's SingleLayerTranscoder computes it, from the MLP input the real model's MLP
module receives; the graph over it passes its checks; a set shorter than the model leaves
blocks without a transcoder, said; bad sets are one line, exit 2, nothing written. The round
trip from `features train --transcoder --skip --export circuit-tracer` is in
test_features_train.py (beside the training it reads)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import build_tiny, forward_then_remove, tiny_gpt2
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.graph.core import graph
from fptrace.commands.graph.examples import write_circuit_tracer_set
from fptrace.core.dictionaries import read_dictionary, read_transcoder_set
from fptrace.errors import BadInput
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 9, 311]
runner = CliRunner()


def _lm():
    return wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)


def _mlp_inputs(lm, ids):
    """Each block's MLP input (T, d), read by hooks on the real model's MLP modules."""
    got, handles = {}, []
    for i, mlp in enumerate(lm.parts.mlps):
        handles.append(mlp.register_forward_hook(
            lambda m, a, o, i=i: got.__setitem__(i, a[0][0].detach().float())))
    forward_then_remove(lm, ids, handles)
    return got


def test_a_hand_written_set_rebuilds_what_circuit_tracer_computes(tmp_path):
    """Blocks 0 and 2: JumpReLU (threshold 0.3) with W_skip; block 1: ReLU (no threshold) with
    W_skip.
    The reconstruction fptrace reads equals pre·(pre > θ) @ W_dec + b_dec + x @ W_skipᵀ,
    pre = x @ W_encᵀ + b_enc, computed here from the files and the model's own MLP input; the
    threshold and the skip both change it (the test could fail)."""
    lm = _lm()
    L, d = lm.config.num_hidden_layers, lm.config.hidden_size
    assert L == 3
    folder = str(tmp_path / "ct")
    write_circuit_tracer_set(folder, [0, 2], d, 48, threshold=0.3, skip=0.5)
    write_circuit_tracer_set(os.path.join(folder, "relu"), [1], d, 48, threshold=None,
                             skip=0.5)
    # the set names block 1's file in a subfolder, relative to the config's folder
    files = ("layer_0.safetensors", "relu/layer_1.safetensors", "layer_2.safetensors")
    write_circuit_tracer_set(folder, [], d, transcoders=list(files))
    tcs = read_transcoder_set(folder)
    assert [(t.site.layer, t.kind, t.W_skip is not None) for t in tcs] == [
        (0, "jumprelu", True), (1, "relu", True), (2, "jumprelu", True)]
    xs = _mlp_inputs(lm, IDS)
    for t, file in zip(tcs, files, strict=True):
        w = load_file(os.path.join(folder, file))
        x = xs[t.site.layer]
        pre = x @ w["W_enc"].T + w["b_enc"]
        theta = w.get("activation_function.threshold")
        a = torch.relu(pre) if theta is None else pre * (pre > theta)
        by_hand = a @ w["W_dec"] + w["b_dec"] + x @ w["W_skip"].T
        torch.testing.assert_close(t.reconstruct(x), by_hand, rtol=1e-5, atol=1e-5)
        if theta is not None:  # the threshold keeps out latents ReLU would let through
            assert bool(((pre > 0) & (pre <= theta)).any())
        assert float((x @ w["W_skip"].T).abs().max()) > 1e-2
        if "/" in file:  # relu/ holds a set of its own, whose config makes its file layer 0
            continue
        # one layer's file read alone (as features --transcoder reads it) is the same
        one = read_dictionary(os.path.join(folder, file), what="--transcoder")
        assert one.site == t.site and one.format == "circuittracer"
        torch.testing.assert_close(one.reconstruct(x), by_hand, rtol=1e-5, atol=1e-5)
    g = graph(lm, IDS, transcoders=folder, max_nodes=12, per_site=3, verify=3)
    assert g.ok, g.checks
    assert g.missing_blocks == ()
    assert any(n.node_type == "latent" for n in g.nodes)


def test_a_set_shorter_than_the_model_leaves_blocks_without_a_transcoder(tmp_path):
    lm = _lm()
    d = lm.config.hidden_size
    folder = write_circuit_tracer_set(str(tmp_path / "ct"), [0], d, 32)
    g = graph(lm, IDS, transcoders=folder, max_nodes=8)
    assert g.ok, g.checks
    assert g.missing_blocks == (1, 2)
    # without `transcoders`, the folder's layer_N.safetensors, each of block N
    os.makedirs(tmp_path / "bare")
    write_circuit_tracer_set(str(tmp_path / "bare"), [1], d, 32)
    with open(tmp_path / "bare" / "config.yaml", "w") as f:
        f.write("model_kind: transcoder_set\nfeature_input_hook: ln2.hook_normalized\n"
                "feature_output_hook: hook_mlp_out\n")
    assert [t.site.layer for t in read_transcoder_set(str(tmp_path / "bare"))] == [1]


def test_relative_paths_from_the_config_or_the_working_directory(tmp_path, monkeypatch):
    """A relative path in `transcoders` is read from the config's folder, else from the working
    directory (circuit-tracer's reading: a set written for it works as it is); one that names
    a file both ways, two different files, is refused in one line."""
    lm = _lm()
    d = lm.config.hidden_size
    work = tmp_path / "work"
    write_circuit_tracer_set(str(work / "files"), [0], d, 32, seed=1)
    folder = str(tmp_path / "ct")
    write_circuit_tracer_set(folder, [], d, transcoders=["files/layer_0.safetensors"])
    monkeypatch.chdir(work)  # the file is there, from the working directory only
    (t,) = read_transcoder_set(folder)
    assert os.path.samefile(t.path, work / "files" / "layer_0.safetensors")
    write_circuit_tracer_set(os.path.join(folder, "files"), [0], d, 32, seed=2)  # both ways
    with pytest.raises(BadInput, match="names two files"):
        read_transcoder_set(folder)
    monkeypatch.chdir(tmp_path)  # from the config's folder only
    (t,) = read_transcoder_set(folder)
    assert os.path.samefile(t.path, os.path.join(folder, "files", "layer_0.safetensors"))
    write_circuit_tracer_set(folder, [], d, transcoders=["nowhere/layer_0.safetensors"])
    with pytest.raises(BadInput, match="does not exist in the config's folder"):
        read_transcoder_set(folder)


def _transpose_enc(folder):
    file = os.path.join(folder, "layer_0.safetensors")
    w = load_file(file)
    w["W_enc"] = w["W_enc"].T.contiguous()
    save_file(w, file)
    return folder


def _nested(folder):
    """A config.yaml whose value nests 100,000 lists deep (PyYAML composes them recursively)."""
    with open(os.path.join(folder, "config.yaml"), "a") as f:
        f.write("deep: " + "[" * 100_000 + "]" * 100_000 + "\n")
    return folder


def _rename_threshold(folder):
    file = os.path.join(folder, "layer_0.safetensors")
    w = load_file(file)
    w["threshold"] = w.pop("activation_function.threshold")
    save_file(w, file)
    return folder


@pytest.mark.parametrize("make, says", [
    (lambda root, d: write_circuit_tracer_set(root, [0], d, model_kind="cross_layer_transcoder"),
     "not read yet"),
    (lambda root, d: write_circuit_tracer_set(root, [0], d, model_kind="sae"),
     "model_kind 'sae'"),
    (lambda root, d: write_circuit_tracer_set(root, [0], d, transcoders=[
        "hf://mntss/x/layer_0.safetensors"]), "fptrace reads local files only"),
    (lambda root, d: write_circuit_tracer_set(root, [0], d, transcoders=[
        "layer_0.safetensors", "layer_1.safetensors"]), "layer 1's file"),
    (lambda root, d: write_circuit_tracer_set(root, [0], d + 8), "another model"),
    (lambda root, d: write_circuit_tracer_set(root, [0], d, transcoders=[]), "lists no file"),
    (lambda root, d: write_circuit_tracer_set(root, [0], d, transcoders="layer_0"),
     "not a list of file paths"),
    (lambda root, d: write_circuit_tracer_set(root, [0], d, threshold=-0.1), "below 0"),
    (lambda root, d: write_circuit_tracer_set(root, [0], d, feature_input_hook="hook_resid_mid"),
     "feature_input_hook 'hook_resid_mid'"),
    (lambda root, d: write_circuit_tracer_set(root, [0], d,
                                              feature_output_hook="hook_resid_post"),
     "feature_output_hook 'hook_resid_post'"),
    (lambda root, d: _transpose_enc(write_circuit_tracer_set(root, [0], d, 48)),
     "looks transposed"),
    (lambda root, d: _rename_threshold(write_circuit_tracer_set(root, [0], d)),
     "activation_function.threshold"),
    (lambda root, d: _nested(write_circuit_tracer_set(root, [0], d)), "nested too deep"),
])
def test_bad_sets_are_one_line_exit_2(make, says, tmp_path):
    folder = tiny_gpt2()
    d = json.loads((Path(folder) / "config.json").read_text())["n_embd"]
    out = tmp_path / "g.json"
    r = runner.invoke(app, ["graph", "The cat sat", "-m", folder, "--transcoders",
                            make(str(tmp_path / "ct"), d), "--graph-json", str(out)])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("fptrace: error")]
    assert len(errors) == 1 and says in errors[0], r.stderr
    assert "Traceback" not in r.output
    assert not out.exists()


def test_features_reads_one_layer_of_a_set_and_refuses_the_whole_set(tmp_path):
    folder = tiny_gpt2()
    d = json.loads((Path(folder) / "config.json").read_text())["n_embd"]
    ct = write_circuit_tracer_set(str(tmp_path / "ct"), [0, 1], d, 32)
    r = runner.invoke(app, ["features", "The cat sat", "-m", folder, "--transcoder", ct])
    assert r.exit_code == 2 and "give one layer's file" in r.stderr, r.output
    r = runner.invoke(app, ["features", "The cat sat", "-m", folder, "--transcoder",
                            os.path.join(ct, "layer_1.safetensors"), "--json"])
    assert r.exit_code == 0, r.output


def test_mlp_hook_out_is_refused_where_a_norm_follows_the_mlp(tmp_path):
    """circuit-tracer's mlp.hook_out is the MLP module's own output; Gemma 2 normalises it
    before the stream receives it (hook_mlp_out, what fptrace decomposes): refused there, while
    a set naming hook_mlp_out is read."""
    from fptrace.commands.features.core import load_dictionaries
    from fptrace.errors import BadInput

    lm = wrap_model(build_tiny("gemma2"), name="tiny-gemma2", random_weights=True)
    d = lm.config.hidden_size
    before = write_circuit_tracer_set(str(tmp_path / "a"), [0], d, 16)
    with pytest.raises(BadInput, match=r"mlp\.hook_out"):
        load_dictionaries(lm, transcoders=[os.path.join(before, "layer_0.safetensors")])
    after = write_circuit_tracer_set(str(tmp_path / "b"), [0], d, 16,
                                     feature_output_hook="hook_mlp_out")
    got = load_dictionaries(lm, transcoders=[os.path.join(after, "layer_0.safetensors")])
    assert got[0].site.layer == 0 and not got[0].module_out
