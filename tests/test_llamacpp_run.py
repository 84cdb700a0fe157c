"""`fptrace run --engine llama.cpp` on the bundled SmolLM2 GGUF: the table's numbers are
llama.cpp's own (checked against an independent llama.cpp pass), its checks hold and fail
loudly where they should, and every bad input is one line with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from fptrace.cli.main import app
from fptrace.engines.llamacpp import binding as B

runner = CliRunner()
PROMPT = "The capital of France is"
needs_lib = pytest.mark.skipif(B.installed_version() is None,
                               reason="the [llamacpp] extra (xllamacpp) is not installed")


def one_line_error(r, needle: str) -> None:
    assert r.exit_code == 2, (r.exit_code, r.stderr[-800:])
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("fptrace: error: ")]
    assert len(lines) == 1 and needle in lines[0], r.stderr[-800:]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
@needs_lib
def test_run_shows_llamacpps_own_numbers(smollm, gguf):
    from fptrace.engines.llamacpp.capture import run_pass

    r = runner.invoke(app, ["run", PROMPT, "--engine", "llama.cpp", "--json",
                            "--snippet", "576"])
    assert r.exit_code == 0, r.stderr[-800:]
    t = json.loads(r.stdout)
    assert t["engine"] == "llama.cpp" and len(t["layers"]) == 31
    assert [tok["id"] for tok in t["tokens"]] == smollm.encode(PROMPT)
    assert t["top_k"][0]["text"] == " Paris"
    assert t["decomposition"]["holds"] and not t["decomposition"]["withheld"]
    # an independent llama.cpp pass: the rows are its l_out tensors at the last position
    own = run_pass(gguf, PROMPT)
    for row in t["layers"][1:]:
        stream = own.tensors[f"l_out-{row['layer']}"].reshape(len(own.ids), -1)[-1]
        np.testing.assert_allclose(row["snippet"], stream, rtol=1e-6, atol=1e-6)
        assert row["resid_norm_last"] == pytest.approx(float(np.linalg.norm(stream)), rel=1e-5)
        attn = own.tensors[f"attn_out-{row['layer']}"].reshape(len(own.ids), -1)[-1]
        assert row["attn_norm_last"] == pytest.approx(float(np.linalg.norm(attn)), rel=1e-5)
    logits = own.logits[-1]
    assert t["top_k"][0]["id"] == int(logits.argmax())
    assert t["top_k"][0]["logit"] == pytest.approx(float(logits.max()), rel=1e-6)
    assert any("computed by llama.cpp" in n for n in t["notes"])


@pytest.mark.slow
@needs_lib
def test_the_view_names_llamacpps_tensors():
    r = runner.invoke(app, ["run", PROMPT, "--engine", "llama.cpp", "--flash-attn", "off"])
    assert r.exit_code == 0, r.stderr[-800:]
    assert "the embed row is its embd" in r.stdout and "flash attention off" in r.stdout


@pytest.mark.slow
@needs_lib
def test_logits_that_do_not_match_withhold_the_lens(smollm, gguf, monkeypatch):
    from fptrace.engines.llamacpp import trace as LT

    lm_pass = LT.run_llamacpp(gguf, PROMPT)
    trace, checks = LT.llamacpp_trace(smollm, lm_pass)
    assert checks.logits_hold and checks.norm_rel < 1e-6 and checks.logits_rel < 0.05
    assert all(r.lens_id is not None for r in trace.layers)
    monkeypatch.setattr(LT, "LOGITS_TOLERANCE", checks.logits_rel / 2)
    trace, _ = LT.llamacpp_trace(smollm, lm_pass)
    assert all(r.lens_id is None for r in trace.layers)
    assert any(n.startswith("logit lens withheld") for n in trace.notes)


@pytest.mark.slow
@needs_lib
def test_a_wrong_name_map_is_a_mismatch(smollm, gguf, monkeypatch):
    import dataclasses

    from fptrace.engines.llamacpp import trace as LT
    from fptrace.errors import Mismatch
    from fptrace.families import llamacpp_names_for
    from fptrace.points import Point

    lm_pass = LT.run_llamacpp(gguf, PROMPT)
    names = llamacpp_names_for("llama")
    wrong = dataclasses.replace(names, points={**names.points, Point.resid_post: "ffn_inp"})
    monkeypatch.setattr(LT, "names_for", lambda p: wrong)
    with pytest.raises(Mismatch, match="not continuous|does not add up"):
        LT.llamacpp_trace(smollm, lm_pass)


# ---------------------------------------------------------------- bad input: one line, exit 2

def test_not_a_gguf(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_text("this is not a GGUF file\n")
    one_line_error(runner.invoke(app, ["run", PROMPT, "-m", str(fake), "--engine",
                                       "llama.cpp"]), "does not start with the GGUF magic")


def test_a_model_folder_is_not_a_gguf(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    one_line_error(runner.invoke(app, ["run", PROMPT, "-m", str(tmp_path), "--engine",
                                       "llama.cpp"]), "runs GGUF files")


def test_extra_not_installed(monkeypatch, gguf):
    monkeypatch.setattr(B, "installed_version", lambda: None)
    B.load.cache_clear()
    try:
        one_line_error(runner.invoke(app, ["run", PROMPT, "--engine", "llama.cpp"]),
                       "pip install \"fptrace[llamacpp]\"")
    finally:
        B.load.cache_clear()


def test_options_llamacpp_does_not_take():
    one_line_error(runner.invoke(app, ["run", PROMPT, "--engine", "llama.cpp",
                                       "--all-positions"]),
                   "--all-positions is not available with --engine llama.cpp")


@pytest.mark.system
@needs_lib
def test_unknown_architecture(tmp_path):
    """A well-formed GGUF of an architecture the pinned llama.cpp does not know: one line, in
    a subprocess (a crash of the interpreter would show as a signal, not exit 2)."""
    import gguf as G

    path = tmp_path / "unknown.gguf"
    w = G.GGUFWriter(str(path), "fptrace_unknown_arch")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = subprocess.run([sys.executable, "-m", "fptrace", "run", PROMPT, "-m", str(path),
                        "--engine", "llama.cpp"], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode == 2, r.stderr[-800:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("fptrace: error: ")]
    assert len(lines) == 1 and "'fptrace_unknown_arch' is unknown to this build" in lines[0]
