"""Issue 32: hostile inputs, each refused at its cause with one line that names the value, and
nothing lost or mixed: digits that are not ASCII, deep JSON, files fptrace did not write, the
statistics of other weights, two runs on one output, a quantization that did nothing, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import tiny_gpt2
from fptrace.cli.main import app

runner = CliRunner()
P = "The cat sat"


@pytest.fixture(scope="module")
def tiny():
    return tiny_gpt2()


def one_line(args, code=2):
    """The run fails with exactly one `fptrace: error:` line (the last on stderr) and `code`."""
    r = runner.invoke(app, args)
    assert r.exit_code == code, (r.exit_code, r.output[-800:])
    assert "Traceback" not in r.output
    lines = [l for l in r.stderr.splitlines() if l.startswith("fptrace: error: ")]
    assert len(lines) == 1 and r.stderr.rstrip().endswith(lines[0]), r.stderr[-800:]
    return lines[0]


# ---- 1. digits that are not ASCII, and numbers that are not numbers, outside places ----

def test_token_id_in_unicode_digits(tiny):
    line = one_line(["steer", P, "-m", tiny, "--token", "#²", "--layer", "1"])
    assert line == ("fptrace: error: --token '#²': the token id '²': not a whole number "
                    "(ASCII digits 0-9)")


def test_max_memory_gpu_in_unicode_digits(tiny):
    line = one_line(["run", P, "-m", tiny, "--device-map", "auto", "--max-memory", "²=1GiB"])
    assert line == ("fptrace: error: --max-memory: the GPU number '²': not a whole number "
                    "(ASCII digits 0-9)")
    line = one_line(["run", P, "-m", tiny, "--device-map", "auto", "--max-memory", "0=²GiB"])
    assert "--max-memory '0=²GiB'" in line


def _vector_file(tmp_path, kind, name, value):
    path = tmp_path / f"v.{kind}"
    if kind == "safetensors":
        from safetensors.numpy import save_file

        save_file({name: value}, str(path))
    else:
        import gguf

        w = gguf.GGUFWriter(str(path), arch="controlvector")
        w.add_tensor(name, value)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return str(path)


@pytest.mark.parametrize("kind", ["safetensors", "gguf"])
def test_control_vector_tensor_named_in_unicode_digits(tiny, tmp_path, kind):
    path = _vector_file(tmp_path, kind, "direction.²", np.ones(32, np.float32))
    line = one_line(["steer", P, "-m", tiny, "--vector", path])
    assert line == (f"fptrace: error: --vector {path}: the block number of the tensor "
                    "'direction.²' is '²': not a whole number (ASCII digits 0-9)")


@pytest.mark.parametrize("kind", ["safetensors", "gguf"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_control_vector_refused_when_read(tiny, tmp_path, kind, bad):
    v = np.ones(32, np.float32)
    v[3] = bad
    path = _vector_file(tmp_path, kind, "direction.1", v)
    line = one_line(["steer", P, "-m", tiny, "--vector", path])
    assert f"--vector {path}: the tensor 'direction.1' holds 1 non-finite value" in line
    assert "the first at [3]" in line


@pytest.mark.parametrize("array, says", [
    (np.array(["1", "²"]), "holds text values, not real numbers"),
    (np.ones(32, np.complex64), "holds complex values, not real numbers"),
    (np.full(32, 1e300), "holds 32 non-finite values (NaN, Inf, or beyond float32's range)"),
    (np.full(32, np.nan, np.float32), "holds 32 non-finite values"),
])
def test_npy_that_is_not_a_real_vector(tiny, tmp_path, array, says):
    path = tmp_path / "v.npy"
    np.save(path, array)
    line = one_line(["steer", P, "-m", tiny, "--vector", str(path), "--layer", "1"])
    assert line.startswith(f"fptrace: error: --vector {path}: an array ") and says in line


def test_a_matrix_is_not_n_values(tiny, tmp_path):
    path = _vector_file(tmp_path, "safetensors", "direction.1", np.ones((4, 8), np.float32))
    line = one_line(["steer", P, "-m", tiny, "--vector", path])
    assert line == (f"fptrace: error: --vector {path}: the direction for block 1 is a (4, 8) "
                    "tensor, not one vector of tiny-gpt2's d_model (32) values")
