"""fptrace features train: on a tiny GPT-2, the loss falls; the folder is SAELens's layout and
reads back through fptrace's reader with the encodings the trainer computed; an interrupted run
resumed ends where an uninterrupted one does; bad options are one line."""

from __future__ import annotations

import json
import os

import pytest
import torch
from typer.testing import CliRunner

from conftest import tiny_gpt2
from fptrace.cli.main import app
from fptrace.core.dictionaries import read_dictionary
from fptrace.commands.features.train import TopK, TrainOptions, collect, train
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
