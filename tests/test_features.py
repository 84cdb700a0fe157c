"""fptrace features: the readout measured against the model itself. The vector a dictionary reads
is taken here by this test's own hooks on the model's modules; the encoding is each format's
formula computed here in numpy; latents + b_dec + error reproduce the stream to 1e-6 relative;
the logit split sums to the model's own logit; a dictionary one place off is refused; the massive
activation of the bundled model is decomposed but kept out of the FVU; bad input is one line."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from conftest import build_tiny, tiny_gpt2
from test_features_dictionary import write_saelens, write_sparsify
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.features.core import features
from fptrace.commands.features.examples import write_seeded
from fptrace.errors import BadInput
from fptrace.models.loading import wrap_model

IDS = [5, 17, 42, 7, 9, 311, 12]
runner = CliRunner()


def tiny(family: str):
    return wrap_model(build_tiny(family), name=f"tiny-{family}", random_weights=True)


def own(lm, ids, module, when="pre"):
    """The input (pre) or output (post) of `module` over the prompt, by a hook of this test."""
    got = {}

    def pre(m, args, kwargs):
        got["x"] = (args[0] if args else kwargs["hidden_states"])[0].detach().double().clone()

    def post(m, args, output):
        out = output[0] if isinstance(output, tuple) else output
        got["x"] = out[0].detach().double().clone()

    handle = module.register_forward_pre_hook(pre, with_kwargs=True) if when == "pre" else \
        module.register_forward_hook(post)
    try:
        with torch.no_grad():
            logits = lm.model(torch.tensor([ids])).logits[0, -1].double()
    finally:
        handle.remove()
    return got["x"].numpy(), logits


def random_weights(d, n, seed=0, scale=0.1):
    r = np.random.default_rng(seed)
    return {"W_enc": r.normal(size=(d, n)).astype(np.float32),
            "W_dec": (r.normal(size=(n, d)) * scale).astype(np.float32),
            "b_enc": (r.normal(size=n) * 0.5).astype(np.float32),
            "b_dec": (r.normal(size=d) * 0.1).astype(np.float32),
            "threshold": np.abs(r.normal(size=n)).astype(np.float32)}


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "gpt_neox", "olmo2"])
def test_readout_of_the_stream_before_a_block(tmp_path, family):
    lm = tiny(family)
    d = int(lm.config.hidden_size)
    w = random_weights(d, 4 * d)
    folder = write_saelens(tmp_path / "s", w, arch="jumprelu", hook="blocks.1.hook_resid_pre")
    r = features(lm, IDS, saes=[folder], latent=3, top=4)
    x, logits = own(lm, IDS, lm.parts.blocks[1])  # the input of block 1, by this test's hook
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    a = np.where(pre > w["threshold"], np.maximum(pre, 0), 0)
    err = x - (a @ w["W_dec"] + w["b_dec"])
    out = r.dictionaries[0]
    np.testing.assert_allclose(out.latent.activations, a[:, 3], rtol=1e-4, atol=1e-4)
    for p, pos in enumerate(out.positions):
        assert pos.l0 == int((a[p] != 0).sum())
        assert pos.norm == pytest.approx(np.linalg.norm(x[p]), rel=1e-5)
        assert pos.error_norm == pytest.approx(np.linalg.norm(err[p]), rel=1e-4, abs=1e-5)
        best = np.argsort(-a[p])[:4]
        assert [v.latent for v in pos.top] == [int(i) for i in best if a[p, i] > 0]
    assert out.decomposition_gap <= 1e-6 and r.ok
    centred = x - x.mean(0)
    assert out.fvu == pytest.approx((err ** 2).sum() / (centred ** 2).sum(), rel=1e-4)
    # the logit split sums to the model's own logit (before the softcap, where there is one)
    att = out.attribution
    assert att is not None
    t = int(logits.argmax())
    assert att.target.id == t
    model = float(logits[t])
    cap = lm.parts.final_softcap
    total = float(np.tanh(att.total / cap) * cap) if cap else att.total
    assert total == pytest.approx(model, rel=1e-4, abs=1e-4)
    assert att.latent_sum + att.b_dec + att.error + att.rest + att.biases == \
        pytest.approx(att.total, abs=1e-9)
    assert sum(x.logits for x in att.latents) + att.other_latents == \
        pytest.approx(att.latent_sum, abs=1e-9)


def test_the_terms_follow_the_dictionary_not_fptrace(tmp_path):
    """Each latent's term is its activation times its decoder row through the final norm frozen
    at the model's actual stream, computed here; the error term holds what the dictionary
    misses."""
    lm = tiny("llama")
    d = int(lm.config.hidden_size)
    w = random_weights(d, 4 * d, seed=3)
    folder = write_saelens(tmp_path / "s", w, hook="blocks.2.hook_resid_post")
    r = features(lm, IDS, saes=[folder], top=3)
    x, _ = own(lm, IDS, lm.parts.blocks[2], "post")
    final, logits = own(lm, IDS, lm.parts.final_norm)
    f = final[-1]
    norm = lm.parts.final_norm
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    gain = norm.weight.detach().double().numpy() / np.sqrt((f ** 2).mean() + eps)
    t = int(logits.argmax())
    u = lm.parts.lm_head.weight.detach().double().numpy()[t]
    a = np.maximum((x[-1] - w["b_dec"]) @ w["W_enc"] + w["b_enc"], 0)
    terms = a * ((w["W_dec"].astype(np.float64) * gain) @ u)
    att = r.dictionaries[0].attribution
    for term in att.latents:
        assert term.logits == pytest.approx(terms[term.latent], rel=1e-4, abs=1e-6)
    err = x[-1] - (a @ w["W_dec"] + w["b_dec"])
    assert att.error == pytest.approx(float((err * gain) @ u), rel=1e-4, abs=1e-5)
    assert att.rest == pytest.approx(float(((f - x[-1]) * gain) @ u), rel=1e-3, abs=1e-5)


def test_transcoder_reads_the_mlp_input_and_rebuilds_its_output(tmp_path):
    lm = tiny("llama")
    d = int(lm.config.hidden_size)
    w = random_weights(d, 4 * d, seed=4)
    folder = write_sparsify(str(tmp_path), w, hook="layers.1.mlp", k=6, transcode=True)
    r = features(lm, IDS, transcoders=[folder], latent=0)
    x, logits = own(lm, IDS, lm.parts.mlps[1])
    y, _ = own(lm, IDS, lm.parts.mlp_adds[1], "post")
    pre = np.maximum(x @ w["W_enc"] + w["b_enc"], 0)  # a sparsify transcoder: no shift
    a = np.zeros_like(pre)
    for p in range(len(pre)):
        top = np.argsort(-pre[p])[:6]
        a[p, top] = pre[p, top]
    err = y - (a @ w["W_dec"] + w["b_dec"])
    out = r.dictionaries[0]
    assert (out.role, out.site, out.out_site) == ("transcoder", "blocks.1.hook_mlp_in",
                                                  "blocks.1.hook_mlp_out")
    np.testing.assert_allclose(out.latent.activations, a[:, 0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose([p.error_norm for p in out.positions],
                               np.linalg.norm(err, axis=-1), rtol=1e-4, atol=1e-5)
    assert out.decomposition_gap <= 1e-6
    assert out.attribution.total == pytest.approx(float(logits.max()), rel=1e-4, abs=1e-4)
    with pytest.raises(BadInput, match="is a transcoder"):
        features(lm, IDS, saes=[folder])


def test_a_skip_transcoders_skip_term_is_its_own_line_and_the_sums_hold(tmp_path):
    """A sparsify skip transcoder (x @ W_skip.mT beside the latents): the error is what the
    latents, b_dec and the skip term leave of the MLP's output (read by hooks here); the logit
    split has the skip's term, computed here through the frozen final norm, and still sums to
    the model's logit."""
    lm = tiny("llama")
    d = int(lm.config.hidden_size)
    w = random_weights(d, 4 * d, seed=5)
    w["W_skip"] = (np.random.default_rng(6).normal(size=(d, d)) * 0.3).astype(np.float32)
    folder = write_sparsify(str(tmp_path), w, hook="layers.1.mlp", k=6, transcode=True,
                            skip=True)
    r = features(lm, IDS, transcoders=[folder])
    x, logits = own(lm, IDS, lm.parts.mlps[1])
    y, _ = own(lm, IDS, lm.parts.mlp_adds[1], "post")
    final, _ = own(lm, IDS, lm.parts.final_norm)
    pre = np.maximum(x @ w["W_enc"] + w["b_enc"], 0)
    a = np.zeros_like(pre)
    for p in range(len(pre)):
        top = np.argsort(-pre[p])[:6]
        a[p, top] = pre[p, top]
    skip = x @ w["W_skip"].T.astype(np.float64)
    err = y - (a @ w["W_dec"] + w["b_dec"] + skip)
    out = r.dictionaries[0]
    assert out.skip and out.decomposition_gap <= 1e-6
    np.testing.assert_allclose([p.error_norm for p in out.positions],
                               np.linalg.norm(err, axis=-1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose([p.skip_norm for p in out.positions],
                               np.linalg.norm(skip, axis=-1), rtol=1e-4, atol=1e-5)
    norm = lm.parts.final_norm
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    f = final[-1]
    gain = norm.weight.detach().double().numpy() / np.sqrt((f ** 2).mean() + eps)
    u = lm.parts.lm_head.weight.detach().double().numpy()[int(logits.argmax())]
    att = out.attribution
    assert att.skip == pytest.approx(float((skip[-1] * gain) @ u), rel=1e-4, abs=1e-5)
    assert att.error == pytest.approx(float((err[-1] * gain) @ u), rel=1e-4, abs=1e-5)
    assert abs(att.skip) > 1e-3  # the skip's term matters in this test
    assert att.latent_sum + att.skip + att.b_dec + att.error + att.rest + att.biases == \
        pytest.approx(att.total, abs=1e-9)
    assert att.total == pytest.approx(float(logits.max()), rel=1e-4, abs=1e-4)


def _projector(lm, ids, hidden_index):
    """An SAE that rebuilds exactly the span of the stream numbered hidden_index (centred) over
    these ids: ±U through a ReLU, b_dec the mean."""
    with torch.no_grad():
        hs = lm.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    y = hs[hidden_index][0].double().numpy()
    c = y.mean(0)
    U = np.linalg.svd(y - c, full_matrices=False)[2][:len(ids) - 1]
    return {"W_enc": np.concatenate([U.T, -U.T], 1).astype(np.float32),
            "W_dec": np.concatenate([U, -U], 0).astype(np.float32),
            "b_enc": np.zeros(2 * len(U), np.float32), "b_dec": c.astype(np.float32)}


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_dictionary_one_place_off_is_refused(tmp_path, family):
    lm = tiny(family)
    w = _projector(lm, IDS, 2)  # trained, in effect, on the output of block 1
    right = write_saelens(tmp_path / "r", w, hook="blocks.1.hook_resid_post")
    assert features(lm, IDS, saes=[right]).dictionaries[0].fvu < 1e-8
    for hook in ("blocks.0.hook_resid_post", "blocks.1.hook_resid_pre",  # one block off / before
                 "blocks.2.hook_resid_post"):
        off = write_saelens(tmp_path / hook, w, hook=hook)
        with pytest.raises(BadInput, match="one place off") as e:
            features(lm, IDS, saes=[off])
        assert "blocks.1.hook_resid_post with FVU" in str(e.value)


def test_massive_activation_of_the_bundled_model(smollm, tmp_path):
    """After block 15 the first position's stream has a norm of ~22,660 against 170-190
    elsewhere: decomposed exactly like the others, left out of the FVU, and said."""
    folder = write_seeded(str(tmp_path / "s"), 576, 1024, hook="blocks.15.hook_resid_post")
    r = features(smollm, "The capital of France is", saes=[folder])
    out = r.dictionaries[0]
    x, _ = own(smollm, list(smollm.prepare("The capital of France is").ids),
               smollm.parts.blocks[15], "post")
    norms = np.linalg.norm(x, axis=-1)
    assert norms[0] > 20000 and (norms[1:] < 400).all()
    assert [p.massive for p in out.positions] == [True] + [False] * (len(norms) - 1)
    assert out.positions[0].norm == pytest.approx(norms[0], rel=1e-4)
    assert out.decomposition_gap <= 1e-6
    errs = np.array([p.error_norm for p in out.positions[1:]])
    centred = x[1:] - x[1:].mean(0)
    assert out.fvu == pytest.approx((errs ** 2).sum() / (centred ** 2).sum(), rel=1e-3)
    assert any("position 0 holds a massive activation" in n for n in r.notes)


def test_top_prompts_are_the_largest_over_the_file(tmp_path):
    from fptrace.models.loading import load_model

    lm = load_model(tiny_gpt2(), device="cpu")  # a tokenizer: the file holds text
    d = int(lm.config.hidden_size)
    sae = write_seeded(str(tmp_path / "s"), d, 4 * d)
    prompts = ["The cat sat on the mat", "A dog ran", "Seven blue birds sang at dawn",
               "It rained"]
    path = tmp_path / "p.txt"
    path.write_text("\n".join(prompts) + "\n")
    r = features(lm, "hello", saes=[sae], latent=5, top_prompts=str(path), top_n=3,
                 batch_size=3)
    every = []
    for i, p in enumerate(prompts):
        one = features(lm, p, saes=[sae], latent=5).dictionaries[0].latent.activations
        every += [(v, f"p:{i + 1}", j) for j, v in enumerate(one) if v > 0]
    every.sort(reverse=True)
    assert r.prompts_read == 4
    assert [(x.prompt_id, x.position) for x in r.top_prompts] == \
        [(pid, j) for _, pid, j in every[:3]]
    for x, (v, _, _) in zip(r.top_prompts, every):
        assert x.activation == pytest.approx(v, rel=1e-4)


def _cli(*args):
    return runner.invoke(app, ["features", *args], catch_exceptions=False)


def test_cli_json_and_view(tmp_path):
    folder = tiny_gpt2()
    sae = write_seeded(str(tmp_path / "s"), 32, 64)
    res = _cli("The cat sat", "-m", folder, "--sae", sae, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["kind"] == "features" and doc["ok"]
    assert doc["dictionaries"][0]["site"] == "blocks.1.hook_resid_pre"
    res = _cli("The cat sat", "-m", folder, "--sae", sae, "--latent", "3",
               "--plot", str(tmp_path / "f.png"))
    assert res.exit_code == 0, res.output
    assert "Latent 3 over the positions" in res.stdout and os.path.getsize(tmp_path / "f.png")
    mine = tmp_path / "notes.png"  # a user's file where the figure would go
    mine.write_bytes(b"my picture")
    res = _cli("The cat sat", "-m", folder, "--sae", sae, "--plot", str(mine))
    assert res.exit_code == 2 and mine.read_bytes() == b"my picture", res.output
    res = _cli("The cat sat", "-m", folder, "--sae", sae, "--plot", str(mine), "--force")
    assert res.exit_code == 0 and mine.read_bytes() != b"my picture", res.output


def test_cli_bad_inputs_are_one_line(tmp_path):
    folder = tiny_gpt2()
    good = write_seeded(str(tmp_path / "s"), 32, 64)
    empty = tmp_path / "empty"
    empty.mkdir()
    wide = write_seeded(str(tmp_path / "w"), 48, 64)
    cut = write_seeded(str(tmp_path / "c"), 32, 64)
    weights = os.path.join(cut, "sae_weights.safetensors")
    data = open(weights, "rb").read()
    with open(weights, "wb") as f:
        f.write(data[:len(data) // 2])
    tc = write_sparsify(str(tmp_path), random_weights(32, 64), hook="layers.1.mlp",
                        transcode=True)
    cases = [((str(empty),), "no config"), ((wide,), "width 48"), ((cut,), "truncated"),
             ((good, "--latent", "64"), "latents 0 to 63"), ((tc,), "is a transcoder"),
             ((good, "--site", "blocks.1.hook_resid_post"), "was trained on")]
    for args, message in cases:
        res = _cli("The cat sat", "-m", folder, "--sae", *args)
        assert res.exit_code == 2, (args, res.output)
        lines = [line for line in res.stderr.splitlines() if line.startswith("fptrace: error")]
        assert len(lines) == 1 and message in lines[0], res.stderr
        assert "Traceback" not in res.stderr


def test_report_section(tmp_path):
    folder = tiny_gpt2()
    sae = write_seeded(str(tmp_path / "s"), 32, 64)
    out = tmp_path / "r.html"
    res = runner.invoke(app, ["report", "The cat sat", "-m", folder, "--sae", sae, "--out",
                              str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    page = out.read_text(encoding="utf-8")
    assert "sparse dictionary features" in page and "blocks.1.hook_resid_pre" in page
    res = runner.invoke(app, ["report", "The cat sat", "-m", folder, "--sae",
                              str(tmp_path / "nowhere"), "--out", str(out)])
    assert res.exit_code == 2 and "no such folder" in res.stderr


def test_steer_by_latent_adds_its_decoder_row(tmp_path):
    """steer --sae DIR --latent N --scale S: the steered logits are those of a plain forward hook
    of this test adding S·dᵢ (dᵢ read here from the weights written) to the output of the block
    the SAE reads."""
    from fptrace.models.loading import load_model

    folder = tiny_gpt2()
    lm = load_model(folder, device="cpu")
    w = random_weights(32, 64, seed=5, scale=1.0)
    sae = write_saelens(tmp_path / "s", w, hook="blocks.1.hook_resid_pre")  # = block 0's output
    res = runner.invoke(app, ["steer", "The cat sat", "-m", folder, "--sae", sae, "--latent",
                              "7", "--scale", "0,3", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["vector"]["source"] == "latent" and doc["vector"]["layers"] == [0]
    assert doc["vector"]["norms"][0] == pytest.approx(float(np.linalg.norm(w["W_dec"][7])),
                                                      rel=1e-5)
    ids = list(lm.prepare("The cat sat").ids)
    row = torch.from_numpy(w["W_dec"][7])

    def add(module, args, output):
        return (output[0] + 3 * row,) + tuple(output[1:]) if isinstance(output, tuple) \
            else output + 3 * row

    handle = lm.parts.blocks[0].register_forward_hook(add)
    try:
        with torch.no_grad():
            logits = lm.model(torch.tensor([ids])).logits[0, -1]
    finally:
        handle.remove()
    steered = next(r for r in doc["rows"] if r["scale"] == 3)
    t = steered["target"]["id"]
    assert steered["target"]["logit"] == pytest.approx(float(logits[t]), rel=1e-4, abs=1e-4)
    for args, message in ((["--sae", sae], "--sae goes with --latent"),
                          (["--latent", "3"], "--latent goes with --sae"),
                          (["--sae", sae, "--latent", "64"], "latents 0 to 63"),
                          (["--sae", sae, "--latent", "1", "--token", " dog"],
                           "--token is not an option of `steer --sae DIR --latent N`")):
        res = runner.invoke(app, ["steer", "The cat sat", "-m", folder, *args])
        assert res.exit_code == 2 and message in res.stderr, (args, res.stderr)


def test_ablate_by_latent_removes_its_write(tmp_path):
    """ablate --sae DIR --latent N: the ablated logits are those of a plain forward hook of this
    test that subtracts aᵢ·dᵢ (aᵢ encoded here from the block's output) at every position."""
    from fptrace.models.loading import load_model

    folder = tiny_gpt2()
    lm = load_model(folder, device="cpu")
    w = random_weights(32, 64, seed=6, scale=1.0)
    sae = write_saelens(tmp_path / "s", w, hook="blocks.0.hook_resid_post")
    a_all = np.maximum((own(lm, list(lm.prepare("The cat sat").ids), lm.parts.blocks[0],
                            "post")[0] - w["b_dec"]) @ w["W_enc"] + w["b_enc"], 0)
    n = int(np.argmax(a_all[-1]))  # a latent active at the last position
    res = runner.invoke(app, ["ablate", "The cat sat", "-m", folder, "--sae", sae, "--latent",
                              str(n), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    row = torch.from_numpy(w["W_dec"][n])

    def remove(module, args, output):
        h = output[0] if isinstance(output, tuple) else output
        x = h[0].double().numpy()
        a = np.maximum((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"], 0)[:, n]
        new = h - torch.from_numpy(a).float()[None, :, None] * row
        return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new

    ids = list(lm.prepare("The cat sat").ids)
    handle = lm.parts.blocks[0].register_forward_hook(remove)
    try:
        with torch.no_grad():
            logits = lm.model(torch.tensor([ids])).logits[0, -1]
    finally:
        handle.remove()
    run = doc["runs"][0]
    t = doc["target"]["id"]
    assert run["parts"] == [f"latent {n} (blocks.0.hook_resid_post)"]
    assert run["logit"] == pytest.approx(float(logits[t]), rel=1e-4, abs=1e-4)
    assert doc["ok"] and doc["checks"][0]["target"] == "ablated_latent"
    assert run["direct"] + run["indirect"] == pytest.approx(run["logit_change"], abs=1e-6)
    for args, message in ((["--sae", sae], "go together"),
                          (["--sae", sae, "--latent", "64"], "latents 0 to 63"),
                          (["--sae", sae, "--latent", "1", "--mlp", "0"],
                           "--mlp is not an option of `ablate --sae DIR --latent N`")):
        res = runner.invoke(app, ["ablate", "The cat sat", "-m", folder, *args])
        assert res.exit_code == 2 and message in res.stderr, (args, res.stderr)


def _one_line(res, code=2):
    assert res.exit_code == code, res.output
    lines = [line for line in res.stderr.splitlines() if line.startswith("fptrace: error")]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def test_cli_hostile_dictionaries_are_one_line(tmp_path):
    """Issue 41: sizes read from the files are checked before use (a Gemma Scope W_enc of one
    or three dimensions exited 70), and what was misleading says what it is."""
    from test_features_dictionary import write_gemmascope

    folder = tiny_gpt2()
    gs = tmp_path / "gemma-scope-2b-pt-res" / "layer_1" / "width_16k"
    flat = random_weights(32, 64)
    flat["W_enc"] = flat["W_enc"].reshape(-1)
    cube = random_weights(32, 64)
    cube["W_enc"] = cube["W_enc"][None]
    empty = {n: (v[:, :0] if n == "W_enc" else v[:0] if n != "b_dec" else v)
             for n, v in random_weights(32, 64).items()}
    turned = random_weights(32, 64)
    turned["W_dec"] = np.ascontiguousarray(turned["W_dec"].T)
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    cases = [
        (write_gemmascope(gs / "flat", flat), "W_enc has 1 dimension"),
        (write_gemmascope(gs / "cube", cube), "W_enc has 3 dimensions"),
        (write_gemmascope(gs / "empty", empty), "0 latents"),
        (write_saelens(tmp_path / "k", random_weights(32, 64), arch="topk", k=65),
         "k 65 is larger than the dictionary's 64 latents"),
        (write_saelens(tmp_path / "b", random_weights(32, 64), apply_b_dec_to_input="false"),
         "apply_b_dec_to_input 'false' is not a JSON boolean"),
        (write_saelens(tmp_path / "t", turned), "looks transposed"),
        (str(loop), "symbolic link loop")]
    for sae, message in cases:
        line = _one_line(_cli("The cat sat", "-m", folder, "--sae", sae))
        assert message in line, (sae, line)


def _fifo(path) -> str:
    os.remove(path) if os.path.exists(path) else None
    os.mkfifo(path)
    return str(path)


def _subprocess(args, sock=None, timeout=60):
    """`python -m fptrace ARGS` with a time limit: a command that waits on a FIFO fails the test
    instead of stalling it (the process is killed at the limit)."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("FPTRACE_SOCKET", None) if sock is None else env.update(FPTRACE_SOCKET=str(sock))
    try:
        return subprocess.run([sys.executable, "-m", "fptrace", *args], env=env, cwd=root,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"fptrace {' '.join(map(str, args))} still waits after {timeout} s")


@pytest.mark.system
def test_a_fifo_is_refused_not_waited_on(tmp_path):
    """Issue 41: a named pipe where a dictionary's cfg.json or weights or a prompt file should
    be: opening it waited for a writer forever."""
    folder = tiny_gpt2()
    cfg = write_seeded(str(tmp_path / "c"), 32, 64)
    _fifo(os.path.join(cfg, "cfg.json"))
    weights = write_seeded(str(tmp_path / "w"), 32, 64)
    _fifo(os.path.join(weights, "sae_weights.safetensors"))
    prompts = _fifo(tmp_path / "prompts.txt")
    for args in (["features", "The cat sat", "-m", folder, "--sae", cfg],
                 ["features", "The cat sat", "-m", folder, "--sae", weights],
                 ["features", "train", prompts, "-m", folder, "--layer", "1", "--out",
                  str(tmp_path / "out")]):
        res = _subprocess(args)
        assert res.returncode == 2, (args, res.stderr)
        assert res.stderr.count("\n") == 1 and "named pipe (FIFO)" in res.stderr, res.stderr


@pytest.mark.system
def test_a_fifo_does_not_stall_a_resident_server(tmp_path):
    """Through `fptrace serve`: the request with a FIFO is refused in one line, and the next
    request is answered (the queue behind it is not stuck)."""
    from test_serve import stop_server

    folder = tiny_gpt2()
    sock = tmp_path / "run" / "s.sock"
    started = _subprocess(["serve", "--idle-timeout", "120"], sock)
    assert started.returncode == 0, started.stderr
    try:
        fifo = write_seeded(str(tmp_path / "c"), 32, 64)
        _fifo(os.path.join(fifo, "cfg.json"))
        good = write_seeded(str(tmp_path / "g"), 32, 64)
        res = _subprocess(["features", "The cat sat", "-m", folder, "--sae", fifo], sock)
        assert res.returncode == 2 and "named pipe (FIFO)" in res.stderr, res.stderr
        res = _subprocess(["features", "The cat sat", "-m", folder, "--sae", good, "--json"],
                          sock)
        assert res.returncode == 0 and json.loads(res.stdout)["ok"], res.stderr
    finally:
        stop_server(sock)
