"""fptrace diff: a trace against itself is exactly zero; float16 against float32 on the bundled
model stays within the documented tolerance; files of different models are allowed and said;
what is not a trace is refused."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import tiny_gpt2
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
