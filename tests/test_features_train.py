"""fptrace features train: on a tiny GPT-2, the loss falls; the folder is SAELens's layout and
reads back through fptrace's reader with the encodings the trainer computed; an interrupted run
resumed ends where an uninterrupted one does; bad options are one line."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.features.train import TopK, TrainOptions, collect, train
from fptrace.core.dictionaries import read_dictionary
from fptrace.errors import BadInput

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
runner = CliRunner()


@pytest.fixture(scope="module")
def lm():
    from fptrace.models.loading import load_model

    return load_model(tiny_gpt2(), device="cpu")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    lines = []
    for name in ("capitals.txt", "seeds.txt"):
        with open(os.path.join(ROOT, "prompts", name), encoding="utf-8") as f:
            lines += [x.strip() for x in f if x.strip()]
    with open(os.path.join(ROOT, "prompts", "facts.jsonl"), encoding="utf-8") as f:
        lines += [json.loads(x)["prompt"] for x in f if x.strip()]
    path = tmp_path_factory.mktemp("p") / "p.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


OPTS = TrainOptions(layer=1, latents=64, k=4, tokens=6400, batch_tokens=64, save_every=20)


def test_training_lowers_the_loss_and_reads_back(lm, prompts, tmp_path):
    out = str(tmp_path / "sae")
    r = train(lm, [prompts], out, OPTS)
    assert r.steps == 100 and r.last_loss < 0.6 * r.first_loss
    assert 0 < r.fvu < 1 and r.l0 == pytest.approx(4.0)
    assert 0 <= r.dead_latents < 64
    cfg = json.load(open(os.path.join(out, "cfg.json")))
    assert cfg["architecture"] == "topk" and cfg["hook_name"] == "blocks.1.hook_resid_post"
    assert cfg["metadata"]["hook_name"] == "blocks.1.hook_resid_post" and cfg["k"] == 4
    # GPT-2's tokenizer adds no begin-of-text token (its <|endoftext|> is the bos id): the
    # config says so, for a reader that reruns the model on its own prompts
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_gpt2())
    first = hf("The capital of France is")["input_ids"][0]
    assert cfg["metadata"]["prepend_bos"] is (first == hf.bos_token_id) is False
    d = read_dictionary(out)
    assert (d.format, d.kind, d.d_sae, d.k) == ("saelens", "topk", 64, 4)
    # the trainer's own encoding of the held-out stream, from the weights it saved
    from safetensors.torch import load_file

    w = load_file(os.path.join(out, "sae_weights.safetensors"))
    sae = TopK(d.d_in, 64, 4, 0)
    with torch.no_grad():
        for name, p in zip(("W_enc", "b_enc", "W_dec", "b_dec"), sae.params()):
            p.copy_(w[name])
    from fptrace.core.inputs import read_inputs

    x, _ = collect(lm, read_inputs([prompts])[:5], 1)
    with torch.no_grad():
        torch.testing.assert_close(d.encode(x), sae.encode(x), rtol=1e-5, atol=1e-5)
        fvu = ((x - d.decode(d.encode(x))) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    assert float(fvu) < 1


def test_an_interrupted_run_resumes_where_it_stopped(lm, prompts, tmp_path):
    whole = str(tmp_path / "whole")
    train(lm, [prompts], whole, OPTS)
    part = str(tmp_path / "part")

    def stop(phase, done, total):
        if phase == "steps" and done == 45:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(lm, [prompts], part, OPTS, progress=stop)
    assert json.load(open(os.path.join(part, "trainer_state.json")))["step"] == 40
    r = train(lm, [prompts], part, OPTS, resume=True)
    assert r.resumed_from == 40
    a = read_dictionary(whole)
    b = read_dictionary(part)
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-6)
    with pytest.raises(BadInput, match="other options"):
        train(lm, [prompts], part, TrainOptions(layer=1, latents=64, k=8, tokens=6400,
                                                batch_tokens=64, save_every=20), resume=True)


def test_cli_train_and_bad_options(prompts, tmp_path):
    folder = tiny_gpt2()
    out = str(tmp_path / "cli")
    res = runner.invoke(app, ["features", "train", prompts, "-m", folder, "--layer", "1",
                              "--out", out, "--latents", "32", "--k", "2", "--tokens", "640",
                              "--batch-tokens", "64", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["kind"] == "features_train" and doc["steps"] == 10
    assert "training: steps" in res.stderr
    res = runner.invoke(app, ["features", "The cat sat", "-m", folder, "--sae", out, "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["ok"]
    for args, message in (
            (["--layer", "1", "--out", out], "is not an empty folder"),
            (["--layer", "7", "--out", str(tmp_path / "n")], "the block is 0 to 1"),
            (["--layer", "1", "--out", str(tmp_path / "n"), "--k", "64", "--latents", "32"],
             "must be below --latents"),
            (["--out", str(tmp_path / "n")], "needs --layer"),
            (["--layer", "1", "--out", str(tmp_path / "n"), "--lr", "nan"], "finite")):
        res = runner.invoke(app, ["features", "train", prompts, "-m", folder, *args])
        assert res.exit_code == 2, (args, res.output)
        lines = [x for x in res.stderr.splitlines() if x.startswith("fptrace: error")]
        assert len(lines) == 1 and message in lines[0], res.stderr


def test_resume_refuses_other_weights_or_other_prompts(lm, prompts, tmp_path):
    """Issue 41: --resume compared the options only: another model of the same width (here the
    same folder with random weights: the same name too) or other prompts resumed silently."""
    from fptrace.models.loading import load_model

    part = str(tmp_path / "part")

    def stop(phase, done, total):
        if phase == "steps" and done == 25:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(lm, [prompts], part, OPTS, progress=stop)
    state = json.load(open(os.path.join(part, "trainer_state.json")))
    assert state["step"] == 20 and len(state["weights"]) == 32 and len(state["inputs"]) == 32
    other = load_model(tiny_gpt2(), device="cpu", random_weights=True, seed=7)
    assert other.name == lm.name and other.config.hidden_size == lm.config.hidden_size
    with pytest.raises(BadInput, match="other weights") as e:
        train(other, [prompts], part, OPTS, resume=True)
    assert state["weights"] in str(e.value) and "\n" not in str(e.value)
    fewer = tmp_path / "fewer.txt"
    fewer.write_text("\n".join(open(prompts).read().splitlines()[:-1]) + "\n", encoding="utf-8")
    with pytest.raises(BadInput, match="other prompts") as e:
        train(lm, [str(fewer)], part, OPTS, resume=True)
    assert state["inputs"] in str(e.value)
    r = train(lm, [prompts], part, OPTS, resume=True)  # the same model and prompts: resumed
    assert r.resumed_from == 20


def test_a_training_too_large_is_refused_before_the_load(prompts, tmp_path):
    """Issue 41: --latents 99999999999 ran out of memory after the model load, as an internal
    error; the memory is estimated up front (the SAE, its gradients and Adam's moments, a step,
    the stream) and refused with exit 3, before anything is loaded."""
    res = runner.invoke(app, ["features", "train", prompts, "-m", tiny_gpt2(), "--layer", "1",
                              "--out", str(tmp_path / "o"), "--latents", "99999999999"])
    assert res.exit_code == 3, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fptrace: error"), res.stderr  # no load line
    assert "needs about" in lines[0] and "free on the CPU" in lines[0] and \
        "--latents" in lines[0], lines[0]
    assert not os.path.exists(tmp_path / "o")
    from fptrace.commands.features.train import training_bytes

    part = training_bytes(32, OPTS, 1000)
    assert part["sae"] == 10 * 4 * (2 * 32 * 64 + 64 + 32)
    assert part["step"] == 2 * 4 * 64 * 64 and part["stream"] == 4 * 1000 * 32
    from fptrace.errors import OutOfMemory
    from fptrace.models.loading import load_model

    with pytest.raises(OutOfMemory, match="99999999999 latents"):
        train(load_model(tiny_gpt2(), device="cpu"), [prompts], str(tmp_path / "p"),
              TrainOptions(layer=1, latents=99_999_999_999, k=4))


# ---- transcoders: features train --transcoder --layers SEL ---------------------------------

TC = TrainOptions(layer=0, latents=128, k=8, tokens=12800, batch_tokens=64, lr=2e-3,
                  save_every=20)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama (SwiGLU, as the bundled model) as a folder, loaded."""
    from conftest import make_llama_folder

    from fptrace.models.loading import load_model

    folder = make_llama_folder(tmp_path_factory.mktemp("llama"))
    return str(folder), load_model(str(folder), device="cpu")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """300 seeded sentences of a small vocabulary (about 2,500 positions): enough for a random
    SwiGLU MLP's transcoder to rebuild most of its output on held-out ones."""
    import random

    rng = random.Random(0)
    words = ("the a cat dog bird sat ran flew on under over mat tree house red blue small big "
             "quickly slowly and then").split()
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) for _ in range(300)]
    path = tmp_path_factory.mktemp("corpus") / "sentences.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def trained(llama, corpus, tmp_path_factory):
    """Transcoders for both blocks of the tiny Llama, with the circuit-tracer export."""
    from fptrace.commands.features.transcoders import train_transcoders

    out = str(tmp_path_factory.mktemp("tc") / "run")
    return out, train_transcoders(llama[1], [corpus], out, TC, None, export="circuit-tracer")


def _own_mlp(lm, texts, block, first=1):
    """(x, y): what block's MLP module receives and returns at every position but the first
    (first=0: every position), each prompt run alone, read by hooks on the MLP module itself
    (not fptrace's hook site)."""
    mlp = lm.model.model.layers[block].mlp
    got = []
    handles = [mlp.register_forward_hook(lambda m, a, o: got.append((a[0][0], o[0])))]
    try:
        with torch.no_grad():
            for text in texts:
                ids = lm.tokenizer.encode(text)
                lm.model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return (torch.cat([x[first:] for x, _ in got]).float(),
            torch.cat([y[first:] for _, y in got]).float())


def test_each_transcoder_rebuilds_its_blocks_mlp_output(llama, corpus, trained):
    """The FVU of the MLP's output, measured here from the weights file and the model's own MLP
    on the held-out prompts, is the trainer's figure and well below 1, and block 0's
    transcoder does not rebuild block 1's MLP."""
    from safetensors.torch import load_file

    from fptrace.commands.features.train import split_held_out
    from fptrace.core.inputs import read_inputs

    lm = llama[1]
    out, r = trained
    assert [x.layer for x in r.layers] == [0, 1] and r.latents == 128 and r.k == 8
    _, held = split_held_out(read_inputs([corpus]), TC)
    w = {}
    for x in r.layers:
        w[x.layer] = load_file(os.path.join(out, f"layer_{x.layer}", "sae_weights.safetensors"))
        assert x.site == f"blocks.{x.layer}.hook_mlp_in"
        assert x.out_site == f"blocks.{x.layer}.hook_mlp_out"

    def fvu(t, x, y):
        pre = torch.relu(x @ t["W_enc"] + t["b_enc"])  # the input is not shifted by b_dec
        v, i = pre.topk(8, dim=-1)
        y_hat = torch.zeros_like(pre).scatter(-1, i, v) @ t["W_dec"] + t["b_dec"]
        return float(((y - y_hat) ** 2).sum() / ((y - y.mean(0)) ** 2).sum())

    for x in r.layers:
        xs, ys = _own_mlp(lm, [it.prompt for it in held], x.layer)
        assert xs.shape[0] == r.held_out_tokens
        measured = fvu(w[x.layer], xs, ys)
        assert measured == pytest.approx(x.fvu, rel=1e-3)
        assert measured < 0.7, (x.layer, measured)
        assert x.l0 == pytest.approx(8.0) and 0 <= x.dead_latents < 128
        assert x.last_loss < 0.5 * x.first_loss
    xs, ys = _own_mlp(lm, [it.prompt for it in held], 1)
    assert fvu(w[0], xs, ys) > 2 * fvu(w[1], xs, ys)
    assert r.fvu_median == pytest.approx(sorted(x.fvu for x in r.layers)[1] / 2
                                         + sorted(x.fvu for x in r.layers)[0] / 2)
    # what is left: the SAELens folders, the run's record, the export; no collected rows and no
    # checkpoints
    assert sorted(os.listdir(out)) == ["circuit-tracer", "layer_0", "layer_1", "transcoders.json"]
    assert sorted(os.listdir(os.path.join(out, "layer_0"))) == ["cfg.json",
                                                               "sae_weights.safetensors"]


def test_the_saelens_folders_read_back_through_features(llama, trained):
    folder, lm = llama
    out, r = trained
    cfg = json.load(open(os.path.join(out, "layer_1", "cfg.json")))
    assert cfg["architecture"] == "topk_transcoder" and cfg["apply_b_dec_to_input"] is False
    assert cfg["hook_name"] == "blocks.1.ln2.hook_normalized" and cfg["hook_layer"] == 1
    assert cfg["hook_name_out"] == "blocks.1.hook_mlp_out" and cfg["d_out"] == cfg["d_in"] == 64
    d = read_dictionary(os.path.join(out, "layer_1"))
    assert (d.role, d.kind, d.k, d.d_sae, d.shift_input) == ("transcoder", "topk", 8, 128, False)
    res = runner.invoke(app, ["features", "The cat sat on the mat", "-m", folder, "--transcoder",
                              os.path.join(out, "layer_1"), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    readout = doc["dictionaries"][0]
    assert doc["ok"] and readout["role"] == "transcoder" and readout["activation"] == "topk"
    assert (readout["site"], readout["out_site"]) == ("blocks.1.hook_mlp_in",
                                                     "blocks.1.hook_mlp_out")
    # the same numbers as the MLP's own input and output give (features reads every position;
    # none of this model's is massive)
    assert not any(p["massive"] for p in readout["positions"])
    xs, ys = _own_mlp(lm, ["The cat sat on the mat"], 1, first=0)
    mine = float(((ys - d.decode(d.encode(xs))) ** 2).sum() / ((ys - ys.mean(0)) ** 2).sum())
    assert readout["fvu"] == pytest.approx(mine, rel=1e-3)


def test_the_circuit_tracer_export_has_what_its_loader_reads(llama, corpus, trained):
    """circuit-tracer 0.5's load_relu_transcoder: b_enc (d_sae,) and b_dec (d_model,) give the
    widths, W_enc and W_dec are (d_sae, d_model) (its encoder is F.linear(x, W_enc, b_enc)),
    `activation_function.threshold` makes it a JumpReLU; load_transcoders reads config.yaml's
    model_kind, scan, hooks and the files in layer order."""
    yaml = pytest.importorskip("yaml")
    import torch.nn.functional as F
    from safetensors.torch import load_file

    from fptrace.commands.features.train import split_held_out
    from fptrace.core.inputs import read_inputs

    lm = llama[1]
    out, r = trained
    ct = os.path.join(out, "circuit-tracer")
    assert r.export == "circuit-tracer" and r.export_folder == ct
    assert sorted(os.listdir(ct)) == ["config.yaml", "layer_0.safetensors", "layer_1.safetensors"]
    cfg = yaml.safe_load(open(os.path.join(ct, "config.yaml")))
    assert cfg["model_kind"] == "transcoder_set" and cfg["scan"]
    assert (cfg["feature_input_hook"], cfg["feature_output_hook"]) == ("mlp.hook_in",
                                                                       "mlp.hook_out")
    assert cfg["transcoders"] == [os.path.join(os.path.abspath(ct), f"layer_{i}.safetensors")
                                  for i in (0, 1)]
    assert isinstance(cfg["model_name"], str)
    _, held = split_held_out(read_inputs([corpus]), TC)
    for x in r.layers:
        t = load_file(cfg["transcoders"][x.layer])
        assert set(t) == {"W_enc", "W_dec", "b_enc", "b_dec", "activation_function.threshold"}
        assert tuple(t["W_enc"].shape) == tuple(t["W_dec"].shape) == (128, 64)
        assert tuple(t["b_enc"].shape) == (128,) and tuple(t["b_dec"].shape) == (64,)
        theta = t["activation_function.threshold"]
        assert tuple(theta.shape) == (128,) and bool((theta == x.export_threshold).all())
        assert x.export_threshold >= 0 and 0 < x.export_l0 < 128
        # circuit-tracer's JumpReLU transcoder, applied as its code applies it, rebuilds the
        # MLP's output as well as the trainer reported (the export's own FVU)
        xs, ys = _own_mlp(lm, [it.prompt for it in held], x.layer)
        pre = F.linear(xs, t["W_enc"], t["b_enc"])
        y_hat = (pre * (pre > theta)) @ t["W_dec"] + t["b_dec"]
        fvu = float(((ys - y_hat) ** 2).sum() / ((ys - ys.mean(0)) ** 2).sum())
        assert fvu == pytest.approx(x.export_fvu, rel=1e-3)
        assert fvu < 1


def test_an_interrupted_multi_layer_run_resumes_to_the_same_transcoders(llama, corpus, trained,
                                                                        tmp_path):
    """Stopped while collecting, resumed; stopped again while block 1 trains (block 0 done),
    resumed: both blocks end with the weights of the uninterrupted run, block 0 kept as it was,
    block 1 continued from its checkpoint."""
    from fptrace.commands.features.transcoders import MANIFEST, train_transcoders

    lm = llama[1]
    whole, _ = trained
    part = str(tmp_path / "part")

    def stop_at(phase_wanted, n):
        """Interrupt at the n-th prompt collected (`prompts` advances by a group of prompts)
        or at step n of a block."""
        seen = [0]

        def stop(phase, done, total):
            if phase == phase_wanted:
                seen[0] = seen[0] + done if phase == "prompts" else done
                if seen[0] >= n:
                    raise KeyboardInterrupt
        return stop

    with pytest.raises(KeyboardInterrupt):
        train_transcoders(lm, [corpus], part, TC, None, export="circuit-tracer",
                          progress=stop_at("prompts", 100))
    assert json.load(open(os.path.join(part, MANIFEST)))["collected"] is None
    with pytest.raises(KeyboardInterrupt):
        train_transcoders(lm, [corpus], part, TC, None, export="circuit-tracer", resume=True,
                          progress=stop_at("layer 1", 45))
    doc = json.load(open(os.path.join(part, MANIFEST)))
    assert list(doc["done"]) == ["0"] and doc["collected"]["train"] > 0
    assert json.load(open(os.path.join(part, "layer_1", "trainer_state.json")))["step"] == 40
    r = train_transcoders(lm, [corpus], part, TC, None, export="circuit-tracer", resume=True)
    assert not r.collected and [x.kept for x in r.layers] == [True, False]
    assert r.layers[1].resumed_from == 40
    for i in (0, 1):
        a = read_dictionary(os.path.join(whole, f"layer_{i}"))
        b = read_dictionary(os.path.join(part, f"layer_{i}"))
        for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
            torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-6)
    with pytest.raises(BadInput, match="other options"):
        train_transcoders(lm, [corpus], part, TC, [1], export=None, resume=True)


def test_cli_transcoders_and_bad_inputs(prompts, tmp_path):
    folder = tiny_gpt2()
    out = str(tmp_path / "tc")
    small = ["--latents", "32", "--k", "2", "--tokens", "640", "--batch-tokens", "64"]
    res = runner.invoke(app, ["features", "train", prompts, "-m", folder, "--transcoder",
                              "--layers", "1", "--out", out, *small, "--json"],
                        catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["kind"] == "features_train_transcoders" and [x["layer"] for x in doc["layers"]] \
        == [1] and doc["export"] is None
    assert "training layer 1: steps" in res.stderr and "collecting the MLPs" in res.stderr
    res = runner.invoke(app, ["features", "train", prompts, "-m", folder, "--layers", "all",
                              "--out", str(tmp_path / "all"), *small, "--transcoder"])
    assert res.exit_code == 0, res.output  # the flag last
    assert "2 TopK transcoders written" in res.stdout and "median FVU" in res.stdout
    new = str(tmp_path / "n")
    for args, message in (
            (["--transcoder", "--layer", "1", "--out", new], "not --layer"),
            (["--transcoder", "--layers", "0-5", "--out", new], "the block is 0 to 1"),
            (["--layers", "1", "--out", new], "--layers is an option of transcoder training"),
            (["--layer", "1", "--export", "circuit-tracer", "--out", new],
             "--export is an option of transcoder training"),
            (["--transcoder", "--layers", "1", "--export", "circuit-tracer", "--out", new],
             "needs a transcoder for every block"),
            (["--transcoder", "--export", "tl", "--out", new], "the exports are circuit-tracer"),
            (["--transcoder", "--out", out], "is not an empty folder"),
            (["--transcoder", "--out", new, "--resume"], "holds no interrupted transcoder"),
            (["--transcoder", "--layers", "1"], "needs --out")):
        res = runner.invoke(app, ["features", "train", prompts, "-m", folder, *args, *small])
        assert res.exit_code == 2, (args, res.output)
        lines = [x for x in res.stderr.splitlines() if x.startswith("fptrace: error")]
        assert len(lines) == 1 and message in lines[0], (args, res.stderr)
        assert not os.path.exists(new)
    # read mode: a bare --transcoder is not a folder
    res = runner.invoke(app, ["features", "The cat", "-m", folder, "--transcoder", "--top", "2"])
    assert res.exit_code == 2 and "give the folder of a transcoder" in res.stderr


def test_the_export_is_refused_where_a_norm_follows_the_mlp():
    """Gemma 2 normalises the MLP's output before the stream receives it: the transcoders rebuild
    that, circuit-tracer's mlp.hook_out is before the norm, so the export would mislabel it."""
    from conftest import build_tiny

    from fptrace.commands.features.transcoders import check_export
    from fptrace.models.loading import wrap_model

    lm = wrap_model(build_tiny("gemma2"), name="tiny-gemma2", random_weights=True)
    n = len(lm.parts.blocks)
    with pytest.raises(BadInput, match="puts a norm after the MLP"):
        check_export("circuit-tracer", list(range(n)), n, lm)
    llama = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    check_export("circuit-tracer", list(range(len(llama.parts.blocks))),
                 len(llama.parts.blocks), llama)


def _gpt2_mlp_rows(lm, texts, block):
    """(x, y): what block's MLP module of a GPT-2 receives and returns at every position but
    each prompt's first, each prompt run alone, read by hooks on the module itself."""
    mlp = lm.model.transformer.h[block].mlp
    got = []
    handle = mlp.register_forward_hook(lambda m, a, o: got.append((a[0][0], o[0])))
    try:
        with torch.no_grad():
            for text in texts:
                lm.model(torch.tensor([lm.tokenizer.encode(text)]))
    finally:
        handle.remove()
    return (torch.cat([x[1:] for x, _ in got]).float(), torch.cat([y[1:] for _, y in got]).float())


def test_a_skip_transcoder_takes_up_an_mlp_that_is_mostly_linear(prompts, tmp_path):
    """A tiny GPT-2 whose block-0 MLP is made mostly linear (its up-projection's bias +4:
    gelu(u + 4) ≈ u + 4, the constant this adds taken back from the down-projection's bias): with the same options, --skip leaves a held-out FVU of the MLP's
    output far below the plain transcoder's; the FVU measured here from the written file
    (W_skip (d_out, d_in), added as x @ W_skip.T) and the model's own MLP is the trainer's;
    SAELens's layout reads back with the skip; the circuit-tracer export carries W_skip."""
    from dataclasses import replace

    from safetensors.torch import load_file

    from fptrace.commands.features.train import split_held_out
    from fptrace.commands.features.transcoders import train_transcoders
    from fptrace.core.inputs import read_inputs
    from fptrace.models.loading import load_model

    lm = load_model(tiny_gpt2(), device="cpu")
    with torch.no_grad():
        mlp = lm.model.transformer.h[0].mlp
        mlp.c_fc.bias += 4.0
        mlp.c_proj.bias -= 4.0 * mlp.c_proj.weight.sum(0)  # Conv1D: x @ W + b, W (4d, d)
    opts = TrainOptions(layer=0, latents=64, k=4, tokens=6400, batch_tokens=64, lr=2e-3,
                        save_every=50)
    plain = train_transcoders(lm, [prompts], str(tmp_path / "plain"), opts, [0])
    out = str(tmp_path / "skip")
    skip = train_transcoders(lm, [prompts], out, replace(opts, skip=True), None,
                             export="circuit-tracer")
    assert skip.skip and not plain.skip
    assert skip.layers[0].fvu < 0.5 * plain.layers[0].fvu, (skip.layers[0].fvu,
                                                            plain.layers[0].fvu)
    with open(os.path.join(out, "layer_0", "cfg.json")) as f:
        assert json.load(f)["architecture"] == "topk_skip_transcoder"
    t = load_file(os.path.join(out, "layer_0", "sae_weights.safetensors"))
    _, held = split_held_out(read_inputs([prompts]), opts)
    xs, ys = _gpt2_mlp_rows(lm, [it.prompt for it in held], 0)
    pre = torch.relu(xs @ t["W_enc"] + t["b_enc"])
    v, i = pre.topk(4, dim=-1)
    y_hat = torch.zeros_like(pre).scatter(-1, i, v) @ t["W_dec"] + t["b_dec"] + xs @ t["W_skip"].T
    fvu = float(((ys - y_hat) ** 2).sum() / ((ys - ys.mean(0)) ** 2).sum())
    assert fvu == pytest.approx(skip.layers[0].fvu, rel=1e-3)
    d = read_dictionary(os.path.join(out, "layer_0"))
    assert d.W_skip is not None
    torch.testing.assert_close(d.reconstruct(xs), y_hat, rtol=1e-4, atol=1e-4)
    # circuit-tracer's layer file: its JumpReLU encoder F.linear(x, W_enc, b_enc) and its
    # compute_skip x @ W_skip.T rebuild the MLP's output as the trainer reported
    ct = load_file(os.path.join(out, "circuit-tracer", "layer_0.safetensors"))
    assert tuple(ct["W_skip"].shape) == (xs.shape[1], xs.shape[1])
    pre = torch.nn.functional.linear(xs, ct["W_enc"], ct["b_enc"])
    theta = ct["activation_function.threshold"]
    y_ct = (pre * (pre > theta)) @ ct["W_dec"] + ct["b_dec"] + xs @ ct["W_skip"].T
    fvu_ct = float(((ys - y_ct) ** 2).sum() / ((ys - ys.mean(0)) ** 2).sum())
    assert fvu_ct == pytest.approx(skip.layers[0].export_fvu, rel=1e-3)
    # fptrace reads the export back (circuit-tracer's layout, its config.yaml): the JumpReLU
    # the trainer evaluated, its FVU on the model's own MLP rows the trainer's export FVU, for
    # every block
    from fptrace.core.dictionaries import read_transcoder_set

    sets = read_transcoder_set(os.path.join(out, "circuit-tracer"))
    assert [t.site.layer for t in sets] == [r.layer for r in skip.layers]
    for t, row in zip(sets, skip.layers, strict=True):
        assert t.kind == "jumprelu" and t.W_skip is not None and not t.shift_input
        xb, yb = _gpt2_mlp_rows(lm, [it.prompt for it in held], row.layer)
        fvu_read = float(((yb - t.reconstruct(xb)) ** 2).sum() / ((yb - yb.mean(0)) ** 2).sum())
        assert fvu_read == pytest.approx(row.export_fvu, rel=1e-3)
        if row.layer == 0:
            torch.testing.assert_close(t.reconstruct(xs), y_ct, rtol=1e-4, atol=1e-4)
    # and `graph --transcoders` reads them: every node sums, the skip a linear path
    from fptrace.commands.graph.core import graph

    g = graph(lm, lm.tokenizer.encode("The capital of France is"), transcoders=out, max_nodes=8)
    assert g.ok, g.checks
    assert any("skip" in f for f in g.freezing)
    # and the export folder too (circuit-tracer's layout): every check passes, no block left out
    g = graph(lm, lm.tokenizer.encode("The capital of France is"),
              transcoders=os.path.join(out, "circuit-tracer"), max_nodes=8, verify=3)
    assert g.ok, g.checks
    assert g.missing_blocks == () and any("skip" in f for f in g.freezing)


def test_an_interrupted_skip_run_resumes_to_the_same_skip_transcoder(llama, corpus, tmp_path):
    """--skip's W_skip and its Adam moments are in the checkpoint: a run stopped at step 25
    (checkpoint at 20) and resumed ends with the weights, W_skip included, of an uninterrupted
    one; a resume without --skip is refused as other options."""
    from dataclasses import replace

    from fptrace.commands.features.transcoders import train_transcoders

    lm = llama[1]
    opts = replace(TC, skip=True)
    whole = str(tmp_path / "whole")
    train_transcoders(lm, [corpus], whole, opts, [1])
    part = str(tmp_path / "part")

    def stop(phase, done, total):
        if phase == "layer 1" and done >= 25:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_transcoders(lm, [corpus], part, opts, [1], progress=stop)
    with pytest.raises(BadInput, match="other options"):
        train_transcoders(lm, [corpus], part, TC, [1], resume=True)
    r = train_transcoders(lm, [corpus], part, opts, [1], resume=True)
    assert r.layers[0].resumed_from == 20 and r.skip
    a = read_dictionary(os.path.join(whole, "layer_1"))
    b = read_dictionary(os.path.join(part, "layer_1"))
    for name in ("W_enc", "b_enc", "W_dec", "b_dec", "W_skip"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-6)


def test_the_skips_start_leaves_out_massive_activations():
    """The least-squares start of a skip (train.least_squares) fits the rows a linear map can
    serve: three rows whose output is a massive activation (as at the bundled model's block 11,
    up to 700× the median norm) are left out, so the map is the planted one, where fitting
    through them would bend it."""
    import torch

    from fptrace.commands.features.train import MASSIVE, least_squares

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4000, 16, generator=g)
    W, b = torch.randn(16, 12, generator=g), torch.randn(12, generator=g)
    y = x @ W + b + 0.01 * torch.randn(4000, 12, generator=g)
    y[[5, 900, 3001]] = 5_000.0 * torch.randn(3, 12, generator=g)  # massive, unrelated to x
    assert float(y.norm(dim=-1).max()) > MASSIVE * float(y.norm(dim=-1).median())
    got_W, got_b = least_squares(x, y)
    assert torch.allclose(got_W, W, atol=2e-3) and torch.allclose(got_b, b, atol=2e-3)
    plain = torch.linalg.lstsq(torch.cat([x, torch.ones(4000, 1)], 1), y).solution
    assert (plain[:16] - W).abs().max() > 1.0  # through the massive rows: another map
