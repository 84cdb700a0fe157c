"""batch --ray on a local Ray cluster started inside a private network and PID namespace
(`unshare --net --pid --fork --mount-proc`, loopback brought up in it), so that Ray binds only
to 127.0.0.1 and everything it starts ends with the namespace: the file equals the local
batch's, record for record; a worker killed mid-run loses nothing; graph's backward passes on
two actors give the one-process graph bit for bit (tests/test_graph_distributed.py holds the
rest of graph --ray, without Ray)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import make_llama_folder
from typer.testing import CliRunner

from fptrace.cli.main import app

pytest.importorskip("ray")
runner = CliRunner()
pytestmark = [pytest.mark.slow, pytest.mark.system,
              pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("ip") is None,
                                 reason="needs unshare and ip (util-linux, iproute2)")]


def _namespace_ok() -> bool:
    r = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", "true"],
                       capture_output=True)
    return r.returncode == 0


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if not _namespace_ok():
        pytest.skip("cannot create a network namespace here (needs root or user namespaces)")
    tmp = tmp_path_factory.mktemp("ray")
    model = make_llama_folder(tmp)
    prompts = tmp / "prompts.txt"
    words = ["The cat sat", "A dog ran far", "Paris is", "One two", "The sky is blue"]
    prompts.write_text("\n".join(words * 8) + "\n")  # 40 prompts
    return tmp, str(model), str(prompts)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _in_namespace(script: str, timeout: int = 240) -> subprocess.CompletedProcess:
    # the code under test for the driver and for Ray's workers (which `ray start` spawns with
    # this environment), whatever the installed copy
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=path)
    return subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", "bash", "-c",
                           "ip link set lo up\n" + script], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _records(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def _same(a, b):
    assert [r["id"] for r in a] == [r["id"] for r in b]
    for x, y in zip(a, b):
        assert x["kind"] == y["kind"] == "trace"
        for la, lb in zip(x["layers"], y["layers"]):
            assert la["resid_norm_last"] == pytest.approx(lb["resid_norm_last"], rel=1e-5)
        assert [t["id"] for t in x["top_k"]] == [t["id"] for t in y["top_k"]]


GRAPH = "--neurons --max-nodes 8 --per-site 2"


@pytest.fixture(scope="module")
def on_ray(setup):
    """batch, stats and graph on one cluster that `ray start` began (what `--ray auto` joins),
    in one namespace: one cluster's start for all, and joining a running cluster is the path
    run."""
    tmp, model, prompts = setup
    py, ray = sys.executable, os.path.join(os.path.dirname(sys.executable), "ray")
    script = f"""
{ray} start --head --num-cpus 2 --include-dashboard=false --disable-usage-stats \
  > {tmp}/ray-start.log 2>&1 || {{ cat {tmp}/ray-start.log; exit 90; }}
{py} -m fptrace batch {prompts} --out {tmp}/ray.jsonl -m {model} -b 4 --ray auto --workers 2 \
  > {tmp}/batch.out 2> {tmp}/batch.err
echo "batch $?"
{py} -m fptrace stats {prompts} --out {tmp}/stats-ray.json -m {model} -b 1 --ray auto \
  --workers 2 --json > {tmp}/stats.out 2> {tmp}/stats.err
echo "stats $?"
{py} -m fptrace graph "The cat sat on the mat" -m {model} {GRAPH} --ray auto --workers 2 \
  --json > {tmp}/graph.out 2> {tmp}/graph.err
echo "graph $?"
{ray} stop --force > /dev/null 2>&1
"""
    r = _in_namespace(script, timeout=400)
    assert "batch" in r.stdout and "graph" in r.stdout, (r.stdout + r.stderr)[-3000:]
    return {line.split()[0]: int(line.split()[1]) for line in r.stdout.splitlines()
            if line.split()[:1] in (["batch"], ["stats"], ["graph"])}


def test_ray_file_equals_local_batch(setup, on_ray):
    tmp, model, prompts = setup
    assert on_ray["batch"] == 0, (tmp / "batch.err").read_text()[-3000:]
    assert (tmp / "batch.out").read_text() == ""  # the records went to the file, Ray's words not
    r = runner.invoke(app, ["batch", prompts, "--out", str(tmp / "local.jsonl"), "-m", model,
                            "-b", "4"])
    assert r.exit_code == 0, r.output[-1500:]
    _same(_records(tmp / "ray.jsonl"), _records(tmp / "local.jsonl"))


def test_killed_worker_loses_nothing(setup):
    tmp, model, prompts = setup
    py = sys.executable
    out = tmp / "killed.jsonl"
    script = f"""
{py} -m fptrace batch {prompts} --out {out} -m {model} -b 2 --ray auto --workers 1 &
batch=$!
for i in $(seq 1 600); do
  [ -s {out} ] && break
  sleep 0.1
done
victim=$(pgrep -f 'ModelActor' | head -n 1)
[ -n "$victim" ] && kill -9 "$victim" && echo "killed $victim"
wait $batch
echo "rc $?"
"""
    r = _in_namespace(script)
    text = r.stdout + r.stderr
    assert "killed" in r.stdout, text[-3000:]
    ids = [rec["id"] for rec in _records(out)]
    assert len(ids) == len(set(ids))  # nothing written twice
    if "rc 0" not in r.stdout:  # Ray gave up on the group: rerunning finishes the rest
        r2 = _in_namespace(f"{py} -m fptrace batch {prompts} --out {out} -m {model} -b 2 "
                           "--ray auto --workers 1")
        assert r2.returncode == 0, (r2.stdout + r2.stderr)[-3000:]
    recs = _records(out)
    assert len(recs) == 40 and len({rec["id"] for rec in recs}) == 40
    assert all(rec["kind"] == "trace" for rec in recs)


def test_ray_missing_or_unreachable(setup):
    tmp, model, prompts = setup
    r = _in_namespace(f"{sys.executable} -m fptrace batch {prompts} --out {tmp / 'x.jsonl'} "
                      f"-m {model} --ray 127.0.0.1:1")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("fptrace: error: --ray 127.0.0.1:1")


def test_stats_on_ray_equals_local(setup, on_ray):
    """stats --ray: shards counted by two actors and merged in input order give, statistic for
    statistic, what the local pass gives (one prompt per forward pass: the same arithmetic)."""
    tmp, model, prompts = setup
    assert on_ray["stats"] == 0, (tmp / "stats.err").read_text()[-3000:]
    # stdout holds the result, nothing of Ray's
    assert json.loads((tmp / "stats.out").read_text())["kind"] == "stats"
    local = tmp / "stats-local.json"
    r = runner.invoke(app, ["stats", prompts, "--out", str(local), "-m", model, "-b", "1"])
    assert r.exit_code == 0, r.output[-1500:]
    b = json.loads((tmp / "stats-ray.json").read_text())
    a = json.loads(local.read_text())
    assert a["statistics"]["prompts"] == b["statistics"]["prompts"]
    for la, lb in zip(a["statistics"]["layers"], b["statistics"]["layers"]):
        for sa, sb in zip(la["sites"], lb["sites"]):
            ca, cb = sa["channels"], sb["channels"]
            for key in ("count", "absmax", "absmax_value", "argmax_prompt", "argmax_position",
                        "argmax_token", "hist"):
                assert ca[key] == cb[key], (la["layer"], sa["site"], key)
            assert ca["mean"] == pytest.approx(cb["mean"], rel=1e-9, abs=1e-12)
            assert ca["m2"] == pytest.approx(cb["m2"], rel=1e-9, abs=1e-12)
        np.testing.assert_allclose(la["sink_sums"], lb["sink_sums"], rtol=1e-12)  # (heads, P)
    assert a["sink_heads"] == b["sink_heads"] and a["massive"] == b["massive"]


def test_graph_on_ray_is_the_one_process_graph_bit_for_bit(setup, on_ray):
    """graph --ray auto --workers 2: the rounds' batches on two actors, each with its own frozen
    passes; every node, edge, score and check the one-process graph's (here, on the thread
    count the namespace's processes had: one), and stdout the JSON alone."""
    import torch

    tmp, model, _ = setup
    assert on_ray["graph"] == 0, (tmp / "graph.err").read_text()[-3000:]
    there = json.loads((tmp / "graph.out").read_text())  # nothing of Ray's on stdout
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the driver and its actors computed
    try:
        r = runner.invoke(app, ["graph", "The cat sat on the mat", "-m", model,
                                *GRAPH.split(), "--json"])
    finally:
        torch.set_num_threads(threads)
    assert r.exit_code == 0, r.output[-1500:]
    here = json.loads(r.stdout)
    assert there["ok"] and there["computed"] == here["computed"] > 0
    for g in (here, there):
        g.pop("seconds")
    assert there == here  # floats parsed from their shortest round-trip digits: bit for bit
