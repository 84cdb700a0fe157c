"""fptrace diff: a trace against itself is exactly zero; float16 against float32 on the bundled
model stays within the documented tolerance; files of different models are allowed and said;
what is not a trace is refused."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.commands.diff.core import TOLERANCE, default_tolerance

runner = CliRunner()


def _save(tmp_path, name, *args):
    r = runner.invoke(app, ["run", *args, "--json"])
    assert r.exit_code == 0, r.stderr
    path = tmp_path / name
    path.write_text(r.stdout)
    return str(path)


def test_a_trace_against_itself_is_zero(tmp_path):
    a = _save(tmp_path, "a.json", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
              "--snippet", "32")
    r = runner.invoke(app, ["diff", a, a, "--json"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["within"] and d["comparable"] and d["first_over"] is None
    assert all(row["rel_diff"] == 0.0 and row["cos"] == pytest.approx(1.0)
               for row in d["layers"])
    assert all(t["rank_a"] == t["rank_b"] for t in d["top_k"])


def test_first_values_only_withholds_the_difference(tmp_path):
    a = _save(tmp_path, "a.json", "The cat sat", "-m", tiny_gpt2(), "--random-weights")
    r = runner.invoke(app, ["diff", a, a, "--json"])
    assert r.exit_code == 1
    d = json.loads(r.stdout)
    assert not d["comparable"] and all(row["rel_diff"] is None for row in d["layers"])
    assert any("--snippet" in n for n in d["notes"])


def test_two_prompts_differ(tmp_path):
    r = runner.invoke(app, ["diff", "The cat sat", "The dog ran", "-m", tiny_gpt2(),
                            "--random-weights", "--json"])
    assert r.exit_code == 1
    d = json.loads(r.stdout)
    assert d["first_over"] is not None and d["layers"][0]["rel_diff"] > 0


def test_different_models_are_said(tmp_path):
    from conftest import make_gpt2_folder

    other, _ = make_gpt2_folder(tmp_path / "other", n_layer=2, n_embd=32)
    a = _save(tmp_path, "a.json", "The cat sat", "-m", tiny_gpt2(), "--random-weights",
              "--snippet", "32")
    b = _save(tmp_path, "b.json", "The cat sat", "-m", str(other), "--snippet", "32")
    d = json.loads(runner.invoke(app, ["diff", a, b, "--json"]).stdout)
    assert any("different models" in n for n in d["notes"])


@pytest.mark.parametrize("content,needle", [("not json", "is not JSON"),
                                            ('{"kind": "shapes"}', "not an fptrace trace"),
                                            ("[1, 2]", "not an fptrace trace")])
def test_not_a_trace(tmp_path, content, needle):
    p = tmp_path / "x.json"
    p.write_text(content)
    r = runner.invoke(app, ["diff", str(p), str(p)])
    assert r.exit_code == 2 and needle in r.stderr


def test_nothing_to_compare():
    r = runner.invoke(app, ["diff", "The cat sat", "-m", tiny_gpt2(), "--random-weights"])
    assert r.exit_code == 2 and "needs something to compare" in r.stderr


def test_default_tolerance_is_the_coarser_dtype():
    assert default_tolerance("float32", "float32")[0] == TOLERANCE["float32"]
    tol, reason = default_tolerance("float32", "bfloat16")
    assert tol == TOLERANCE["bfloat16"] and "bfloat16" in reason


@pytest.mark.slow
def test_float16_against_float32_on_the_bundled_model(smollm):
    r = runner.invoke(app, ["diff", "The capital of France is", "--dtype-b", "float16",
                            "--json"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["a"]["dtype"] == "float32" and d["b"]["dtype"] == "float16"
    assert d["within"] and d["tolerance"] == TOLERANCE["float16"]
    assert max(row["rel_diff"] for row in d["layers"]) < TOLERANCE["float16"] / 2


# ---- mixture of experts: routing flips -------------------------------------------------------

def _plant_flip(model, ids):
    """Nudge one expert's row of the last block's router (its own weight, in place) so that
    exactly one position's chosen set changes there, by the model's own router (a hook on it
    run before and after); returns (block, position)."""
    layer = model.config.num_hidden_layers - 1
    router = model.model.layers[layer].mlp.gate
    seen = {}
    h = router.register_forward_hook(
        lambda m, a, o: seen.update(x=a[0].reshape(-1, a[0].shape[-1]), idx=o[2]))
    try:
        with torch.no_grad():
            model(torch.tensor([ids]), use_cache=False)
    finally:
        h.remove()
    x, idx = seen["x"], seen["idx"]
    k = idx.shape[-1]
    with torch.no_grad():
        logits = x @ router.weight.T  # (T, E)
        ranked = logits.argsort(-1, descending=True)
        margins = logits.gather(1, ranked[:, k - 1:k]) - logits.gather(1, ranked[:, k:k + 1])
    original = router.weight.detach().clone()
    for p in margins[:, 0].argsort().tolist():  # the closest call first
        e = int(ranked[p, k])  # the best expert not chosen there
        nudge = (float(margins[p, 0]) * 1.05 + 1e-4) * x[p] / x[p].pow(2).sum()
        with torch.no_grad():
            router.weight[e] += nudge
            now = (x @ router.weight.T).topk(k, dim=-1).indices
        flipped = [t for t in range(len(ids)) if set(now[t].tolist()) != set(idx[t].tolist())]
        if flipped == [p]:
            return layer, p
        with torch.no_grad():
            router.weight.copy_(original)
    raise AssertionError("no single-position flip found")


@pytest.mark.parametrize("family", ["mixtral", "olmoe", "qwen3_moe"])
def test_diff_finds_a_planted_routing_flip(family):
    """Side b is side a with one router row nudged so that one position's choice changes at
    one block: diff finds that block and position and nothing else, with each side's experts
    as the models' own routers chose them."""
    import copy

    from conftest import build_tiny_moe

    from fptrace.commands.diff.core import diff
    from fptrace.core.trace import run_trace
    from fptrace.models.loading import wrap_model

    ids = [5, 17, 42, 7, 9, 311, 2, 80, 64, 12]
    model_a = build_tiny_moe(family)
    model_b = copy.deepcopy(model_a)
    layer, position = _plant_flip(model_b, ids)
    a = run_trace(wrap_model(model_a, name="a", random_weights=True), ids, snippet=64)
    b = run_trace(wrap_model(model_b, name="a", random_weights=True), ids, snippet=64)
    d = diff(a, b, same_input=True)
    r = d.routing
    assert r is not None and r.flipped == 1 and len(r.flips) == 1
    assert (r.first.layer, r.first.position) == (layer, position)
    assert r.compared == len(ids) * len(a.routing.blocks)
    assert r.parted_before == 0.0  # nothing before the nudged router differs
    own = {}
    for name, m in (("a", model_a), ("b", model_b)):
        h = m.model.layers[layer].mlp.gate.register_forward_hook(
            lambda mod, args, out, name=name: own.update({name: out[2][position].tolist()}))
        try:
            with torch.no_grad():
                m(torch.tensor([ids]), use_cache=False)
        finally:
            h.remove()
    assert set(r.first.experts_a) == set(own["a"]) != set(r.first.experts_b) == set(own["b"])
    same = diff(a, a, same_input=True).routing
    assert same.flipped == 0 and same.first is None


def test_diff_of_a_dense_model_has_no_routing():
    from conftest import build_tiny

    from fptrace.commands.diff.core import diff
    from fptrace.core.trace import run_trace
    from fptrace.models.loading import wrap_model

    lm = wrap_model(build_tiny("llama"), name="tiny-llama", random_weights=True)
    t = run_trace(lm, [1, 2, 3])
    assert diff(t, t).routing is None


def test_cli_diff_model_b_shows_the_flip(tmp_path):
    """`fptrace diff PROMPT -m A --model-b B`, B a copy of A with the planted flip: the view
    names the first flip, the JSON holds it."""
    import shutil

    from conftest import make_moe_folder

    folder_a, model = make_moe_folder(tmp_path)
    prompt = "The cat sat on the mat and the dog ran"
    ran = runner.invoke(app, ["run", prompt, "-m", str(folder_a), "--json"])
    assert ran.exit_code == 0, ran.stderr
    ids = [t["id"] for t in json.loads(ran.stdout)["tokens"]]
    layer, position = _plant_flip(model, ids)
    folder_b = tmp_path / "b"
    model.save_pretrained(folder_b)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(folder_a / name, folder_b / name)
    args = ["diff", prompt, "-m", str(folder_a), "--model-b", str(folder_b)]
    res = runner.invoke(app, args + ["--json"])
    data = json.loads(res.stdout)
    flips = data["routing"]["flips"]
    assert [(f["layer"], f["position"]) for f in flips] == [(layer, position)]
    view = runner.invoke(app, args)
    assert f"Routing flips: 1 of {data['routing']['compared']} block-positions" in view.stdout
    assert f"the first at block {layer}, position {position}" in view.stdout
