"""Every command through typer's CliRunner: output, JSON contract, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import make_gpt2_folder, tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.main import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


def one_line_error(result, code=None):
    assert result.exit_code != 0
    if code is not None:
        assert result.exit_code == code
    # progress lines may precede it on stderr; the error itself is exactly one line
    lines = [l for l in result.stderr.splitlines() if l.startswith("fptrace: error: ")]
    assert len(lines) == 1, result.stderr
    assert result.stderr.rstrip().endswith(lines[0])
    assert "Traceback" not in result.output
    return lines[0]


HELP_CHECK = """
import contextlib, io, runpy, sys
sys.argv = ["fptrace", "--help"]
top = io.StringIO()
with contextlib.redirect_stdout(top), contextlib.suppress(SystemExit):
    runpy.run_module("fptrace", run_name="__main__")  # `fptrace --help`, by the front door
from fptrace.cli.main import COMMANDS, answer
codes = {}
for _, name, _ in COMMANDS:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        codes[name] = (answer([name, "--help"]), "Usage:" in out.getvalue())
heavy = [m for m in ("torch", "transformers", "numpy", "safetensors", "torchao", "ray",
                     "matplotlib", "textual", "playwright") if m in sys.modules]
print(repr((top.getvalue(), codes, heavy)))
"""


@pytest.mark.system
def test_help_does_not_import_torch():
    """`fptrace --help` through the front door (fptrace/__main__.py, the client, no server) and
    then every command's --help, in one fresh process: all of them print their help, and none
    imports torch, transformers, numpy or an optional library (docs/development.md)."""
    import ast

    done = subprocess.run([sys.executable, "-c", HELP_CHECK], capture_output=True, text=True,
                          env=dict(os.environ, FPTRACE_SERVER="off", COLUMNS="100"),
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    top, codes, heavy = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert "Usage: fptrace" in top and "run" in top, top[:500]
    assert len(codes) >= 18 and all(c == (0, True) for c in codes.values()), codes
    assert heavy == [], heavy


def test_help_lists_resolution_order():
    result = invoke("run", "--help")
    assert result.exit_code == 0
    assert "built-in alias" in result.output and ".gguf" in result.output
    assert "hub id" in result.output


@pytest.mark.slow
def test_run_tables_on_bundled_model(smollm):
    result = invoke("run", "The capital of France is", "--top-k", "3")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "smollm2-135m" in out and "llama" in out
    assert "␣Paris" in out and "␣France" in out
    assert "(1, 5, 576)" in out and "(1, 1, 49152)" in out
    assert "Top-3" in out


@pytest.mark.slow
def test_run_json_contract(smollm):
    result = invoke("run", "The capital of France is", "--json", "--snippet", "2")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["schema_version"] and data["kind"] == "trace"
    assert {"model", "tokens", "shapes", "layers", "final_norm", "top_k", "notes",
            "nonfinite"} <= set(data)
    assert [t["id"] for t in data["tokens"]] == [504, 3575, 282, 4649, 314]
    assert data["top_k"][0]["text"] == " Paris"
    assert len(data["layers"]) == 31 and data["layers"][0]["point"] == "embed"
    assert len(data["layers"][5]["snippet"]) == 2
    assert data["shapes"][-1]["shape"] == [1, 1, 49152]
    assert "loaded" not in result.stdout  # progress goes to stderr


@pytest.mark.slow
def test_all_positions_flag(smollm):
    data = json.loads(invoke("run", "The capital of France is", "--json",
                             "--all-positions").stdout)
    assert data["shapes"][-1]["shape"] == [1, 5, 49152]


def test_random_weights_say_so():
    result = invoke("run", "The cat sat", "--model", tiny_gpt2(), "--random-weights", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["model"]["random_weights"] is True
    assert [t["id"] for t in data["tokens"]] == [464, 3797, 3332]
    assert any("RANDOM WEIGHTS" in n for n in data["notes"])
    table = invoke("run", "The cat sat", "--model", tiny_gpt2(), "--random-weights")
    assert "RANDOM WEIGHTS" in table.stdout


def test_random_weights_are_seeded():
    a = json.loads(invoke("run", "The cat sat", "-m", tiny_gpt2(), "--random-weights", "--json",
                          "--seed", "3").stdout)
    b = json.loads(invoke("run", "The cat sat", "-m", tiny_gpt2(), "--random-weights", "--json",
                          "--seed", "3").stdout)
    c = json.loads(invoke("run", "The cat sat", "-m", tiny_gpt2(), "--random-weights", "--json",
                          "--seed", "4").stdout)
    assert a["layers"] == b["layers"]
    assert a["layers"] != c["layers"]


def test_models_lists_aliases():
    result = invoke("models", "--json")
    assert result.exit_code == 0
    aliases = {m["alias"] for m in json.loads(result.stdout)["models"]}
    assert {"gpt2", "llama-3.1-8b", "smollm2-135m", "qwen2.5-0.5b"} <= aliases
    assert "smollm2-135m" in invoke("models").stdout


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t"])
def test_empty_prompt(prompt):
    result = invoke("run", prompt, "-m", tiny_gpt2(), "--random-weights")
    line = one_line_error(result)
    assert "empty" in line
    assert "loaded" not in result.stderr  # refused before any model is loaded


def test_unknown_model():
    line = one_line_error(invoke("run", "hi", "--model", "gpt-3"))
    assert "gpt-3" in line and "smollm2-135m" in line


def test_missing_gguf(tmp_path):
    line = one_line_error(invoke("run", "hi", "--model", str(tmp_path / "nope.gguf")))
    assert "no such GGUF file" in line


def test_corrupt_gguf(tmp_path, cache_dir):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4000))
    line = one_line_error(invoke("run", "hi", "--model", str(bad)))
    assert "bad.gguf" in line


def test_hub_id_offline():
    line = one_line_error(invoke("run", "hi", "--model", "nobody/no-such-model"))
    assert "nobody/no-such-model" in line and "cache" in line


def test_prompt_longer_than_context():
    long = "word " * 40  # the tiny GPT-2 reads 32 positions
    line = one_line_error(invoke("run", long, "-m", tiny_gpt2(), "--random-weights"))
    assert "at most 32" in line and "--truncate" in line
    n_tokens = int(line.split("the prompt is ")[1].split()[0])
    assert n_tokens > 32
    ok = invoke("run", long, "-m", tiny_gpt2(), "--random-weights", "--truncate", "--json")
    assert ok.exit_code == 0, ok.stderr
    data = json.loads(ok.stdout)
    assert len(data["tokens"]) == 32 and data["truncated"] == n_tokens - 32


def test_bad_options():
    one_line_error(invoke("run", "hi", "-m", tiny_gpt2(), "--random-weights", "--device", "tpu"))
    one_line_error(invoke("run", "hi", "-m", tiny_gpt2(), "--random-weights", "--dtype", "int3"))


def _gpt2_folder(tmp_path, weights="safetensors"):
    return make_gpt2_folder(tmp_path, weights)


def test_local_folder(tmp_path):
    folder, _ = _gpt2_folder(tmp_path)
    result = invoke("run", "The cat sat", "--model", str(folder), "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [t["id"] for t in data["tokens"]] == [464, 3797, 3332]
    assert data["model"]["n_layers"] == 2 and data["model"]["family"] == "gpt2"


def test_pickle_weights_refused(tmp_path):
    folder, _ = _gpt2_folder(tmp_path, weights="pickle")
    line = one_line_error(invoke("run", "The cat sat", "--model", str(folder)))
    assert "pickle" in line and "--allow-pickle" in line
    ok = invoke("run", "The cat sat", "--model", str(folder), "--allow-pickle", "--json")
    assert ok.exit_code == 0, ok.stderr


def test_folder_without_config(tmp_path):
    line = one_line_error(invoke("run", "hi", "--model", str(tmp_path)))
    assert "config.json" in line


@pytest.mark.system
@pytest.mark.parametrize("args,needle", [
    (["run", "hi", "--top-k", "0"], "--top-k"), (["run", "hi", "--top-k", "x"], "--top-k"),
    (["run"], "give a PROMPT"), (["batch"], "Missing argument"), (["nosuch"], "No such command")])
def test_usage_errors_are_one_line_too(args, needle):
    """Through the real entry point: click's usage errors become one `fptrace: error:` line."""
    p = subprocess.run([sys.executable, "-m", "fptrace", *args], capture_output=True, text=True)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fptrace: error:") and needle in lines[0]
