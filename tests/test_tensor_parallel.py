"""Tensor parallelism through transformers and torch's launcher, on CPU with gloo: two ranks
give the single process's trace (--tp 2 starts them with torch's launcher); a model whose heads
do not divide is refused before anything starts. Each launch takes ~10 s on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import make_llama_folder
from typer.testing import CliRunner

from fptrace.cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return str(make_llama_folder(tmp_path_factory.mktemp("tp"), n_heads=4, n_kv_heads=2))


def _fptrace(*args, timeout=240):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "fptrace", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def _close(a, b):
    for la, lb in zip(a["layers"], b["layers"]):
        assert la["resid_norm_last"] == pytest.approx(lb["resid_norm_last"], rel=1e-5, abs=1e-5)
        assert la["snippet"] == pytest.approx(lb["snippet"], rel=1e-5, abs=1e-5)
    assert [t["id"] for t in a["top_k"]] == [t["id"] for t in b["top_k"]]
    for ta, tb in zip(a["top_k"], b["top_k"]):
        assert ta["prob"] == pytest.approx(tb["prob"], rel=1e-5, abs=1e-7)


@pytest.mark.system
@pytest.mark.slow
def test_tp_equals_one_process(llama):
    """--tp 2 runs `python -m torch.distributed.run --standalone --nproc-per-node=2 -m fptrace`
    with the other arguments (tensor_parallel.launch), the command a user types to launch the
    ranks themselves: one launch covers both."""
    one = json.loads(runner.invoke(app, ["run", "The cat sat", "-m", llama, "--json",
                                         "--snippet", "64"]).stdout)
    r = _fptrace("run", "The cat sat", "-m", llama, "--json", "--snippet", "64", "--tp", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    two = json.loads(r.stdout)  # only rank 0 printed: one JSON object
    assert two["model"]["tensor_parallel"] == 2 and one["model"]["tensor_parallel"] == 1
    _close(two, one)


def test_tp_launches_torchs_launcher_with_the_other_arguments(monkeypatch):
    from fptrace.models import tensor_parallel

    seen = []
    monkeypatch.setattr(tensor_parallel.subprocess, "run",
                        lambda cmd, env: seen.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    n, rest = tensor_parallel.strip_tp(["run", "hi", "--tp", "2", "--json"])
    assert tensor_parallel.launch(n, rest) == 0
    assert seen == [[sys.executable, "-m", "torch.distributed.run", "--standalone",
                     "--nproc-per-node=2", "-m", "fptrace", "run", "hi", "--json"]]


@pytest.mark.system
@pytest.mark.slow
def test_explain_and_batch_under_tp(llama, tmp_path):
    r = _fptrace("explain", "The cat sat", "-m", llama, "--layer", "1", "--json", "--tp", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["match"] is True  # sharded weights read whole
    prompts = tmp_path / "p.txt"
    prompts.write_text("The cat sat\nThe dog ran\nA bird\n")
    r = _fptrace("batch", str(prompts), "--out", str(tmp_path / "tp.jsonl"), "-m", llama,
                 "-b", "2", "--tp", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    one = runner.invoke(app, ["batch", str(prompts), "--out", str(tmp_path / "one.jsonl"),
                              "-m", llama, "-b", "2"])
    assert one.exit_code == 0
    a = [json.loads(x) for x in (tmp_path / "tp.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "one.jsonl").read_text().splitlines()]
    assert [x["id"] for x in a] == [x["id"] for x in b] and len(a) == 3  # written once, rank 0
    for x, y in zip(a, b):
        _close(x, y)


def test_heads_that_do_not_divide_are_refused_before_starting(tmp_path):
    nine = str(make_llama_folder(tmp_path, n_heads=9, n_kv_heads=3))
    r = runner.invoke(app, ["run", "The cat sat", "-m", nine, "--tp", "2"])
    assert r.exit_code == 2
    line = r.stderr.strip().splitlines()[-1]
    assert "9 attention heads" in line and "divide by 2" in line
    assert "loaded" not in r.stderr


@pytest.mark.parametrize("args,needle", [(["--device-map", "auto"], "use one of them"),
                                         (["--random-weights"], "save the random-weight")])
def test_tp_refusals(llama, args, needle):
    r = runner.invoke(app, ["run", "hi", "-m", llama, "--tp", "2", *args])
    assert r.exit_code == 2 and needle in r.stderr.strip().splitlines()[-1]


def test_gpt2_has_no_plan(tmp_path):
    from conftest import tiny_gpt2

    r = runner.invoke(app, ["run", "hi", "-m", tiny_gpt2(), "--tp", "2"])
    assert r.exit_code == 2 and "no tensor-parallel plan" in r.stderr


def test_gpu_plan():
    from fptrace.commands.shapes.core import shape_report

    r = shape_report("llama-3.1-8b", seq_len=8, dtype="bfloat16", gpu_memory="6GiB")
    p = r.plan
    assert p.weights_bytes == r.cost.weights_bytes["bfloat16"]
    assert p.needed_bytes == p.weights_bytes + r.cost.kv_cache_bytes
    assert p.gpus_needed == 3 and p.tp == 4  # 3 does not divide 32 heads / 8 KV heads
    assert shape_report("llama-3.1-8b", seq_len=8, dtype="bfloat16",
                        gpu_memory="80GiB").plan.tp == 1
    big = shape_report("llama-3.1-405b", seq_len=8192, dtype="bfloat16", gpu_memory="80GiB")
    assert big.plan.gpus_needed == 10 and big.plan.tp is None  # 8 KV heads: at most --tp 8
    r = runner.invoke(app, ["shapes", "-m", "gpt2", "--gpu-memory", "lots"])
    assert r.exit_code == 2 and "--gpu-memory" in r.stderr
