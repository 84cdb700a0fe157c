"""`fptrace diff PROMPT --engine-b llama.cpp` on the bundled SmolLM2 GGUF: transformers against
llama.cpp, block by block and point by point, checked against transformers' own hidden states
and llama.cpp's own tensors; a tokenizer difference named; bad combinations one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.engines.llamacpp import binding as B

runner = CliRunner()
PROMPT = "The capital of France is"
needs_lib = pytest.mark.skipif(B.installed_version() is None,
                               reason="the [llamacpp] extra (xllamacpp) is not installed")


@pytest.fixture(scope="module")
def deep_result(cache_dir, gguf):
    r = runner.invoke(app, ["diff", PROMPT, "--engine-b", "llama.cpp", "--deep",
                            "--deep-layers", "0-2", "--json"])
    assert r.exit_code == 1, r.stderr[-800:]  # they differ beyond float32's 1e-4
    return json.loads(r.stdout)


@pytest.mark.slow
@needs_lib
def test_block_errors_are_the_engines_own(smollm, gguf, deep_result):
    """Each block's relative difference is ‖l_out-k − hidden_states[k+1]‖ / ‖hidden_states‖ at
    the last position: transformers' own hidden states against llama.cpp's own tensor."""
    import torch

    from fptrace.engines.llamacpp.capture import run_pass

    d = deep_result
    assert d["a"]["label"] == "transformers" and d["b"]["label"] == "llama.cpp"
    assert [t[0] for t in d["a"]["tokens"]] == [t[0] for t in d["b"]["tokens"]]
    ids = smollm.encode(PROMPT)
    with torch.inference_mode():
        hs = smollm.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    own = run_pass(gguf, PROMPT, ids=ids)
    assert d["layers"][0]["rel_diff"] == 0.0  # block 0 reads the same embedding
    for row in d["layers"][1:29]:  # hidden_states[-1] has the final norm applied
        k = row["layer"]
        a = hs[k + 1][0, -1].numpy()
        b = own.tensors[f"l_out-{k}"].reshape(len(ids), -1)[-1]
        want = np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(a)
        assert row["rel_diff"] == pytest.approx(want, rel=1e-3, abs=1e-7), k
        assert 1e-4 < row["rel_diff"] < 0.05
    assert d["first_over"] == "block 0"


@pytest.mark.slow
@needs_lib
def test_deep_names_the_first_parting_point(deep_result):
    deep = deep_result["deep"]
    assert deep["layers"] == [0, 1, 2]
    compared = {p["point"] for p in deep["blocks"][0]["points"]}
    assert {"resid_pre", "ln1", "q", "k", "v", "z", "attn_out", "resid_mid", "ln2",
            "mlp_gate", "mlp_up", "mlp_act", "mlp_out", "resid_post"} <= compared
    first = deep["blocks"][0]["points"]
    assert first[0]["point"] == "resid_pre" and first[0]["rel"] == 0.0
    ln1 = next(p for p in first if p["point"] == "ln1")
    assert ln1["rel"] < 1e-6  # the same norm of the same input, in float32
    parted = deep["parted"]
    assert parted["layer"] == 0 and parted["point"] in ("q", "k", "v")
    assert parted["cause"] == "operation"


@pytest.mark.slow
@needs_lib
def test_within_a_looser_tolerance_exits_0(cache_dir):
    r = runner.invoke(app, ["diff", PROMPT, "--engine-b", "llama.cpp", "--tolerance", "0.1",
                            "--json"])
    assert r.exit_code == 0, r.stderr[-800:]
    d = json.loads(r.stdout)
    assert d["within"] and d["deep"] is None and d["top_k"][0]["rank_b"] == 1


@pytest.mark.slow
@needs_lib
def test_a_tokenizer_difference_is_named(smollm, gguf, monkeypatch):
    from fptrace.commands.diff.engine import engine_diff
    from fptrace.engines import engine
    from fptrace.engines.llamacpp import capture as E

    real = E.tokenize
    monkeypatch.setattr(E, "tokenize", lambda lib, vocab, text: real(lib, vocab, text)[::-1])
    result = engine_diff(smollm, engine("llama.cpp"), gguf, PROMPT, tolerance=0.1)
    said = [n for n in result.notes if n.startswith("the tokenizers differ")]
    assert len(said) == 1 and "' is', ' France'" in said[0]
    assert [i for i, _ in result.b.tokens] == smollm.encode(PROMPT)  # transformers' ids, run


def one_line_error(r, needle: str) -> None:
    assert r.exit_code == 2, (r.exit_code, r.stderr[-800:])
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("fptrace: error: ")]
    assert len(lines) == 1 and needle in lines[0], r.stderr[-800:]


def test_engine_b_with_another_setting_is_refused():
    one_line_error(runner.invoke(app, ["diff", PROMPT, "--engine-b", "llama.cpp", "--dtype-b",
                                       "float16"]), "runs a GGUF in llama.cpp: give it without")


def test_engine_b_with_two_prompts_is_refused():
    one_line_error(runner.invoke(app, ["diff", PROMPT, "Another", "--engine-b", "llama.cpp"]),
                   "give one PROMPT")


def test_engine_b_on_a_model_folder_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    one_line_error(runner.invoke(app, ["diff", PROMPT, "-m", str(tmp_path), "--engine-b",
                                       "llama.cpp"]), "runs GGUF files")
