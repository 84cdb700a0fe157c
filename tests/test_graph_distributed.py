"""graph's backward passes computed elsewhere (graph(pool=...), `graph --ray`), without Ray: an
in-process stand-in for the cluster (InProcessGroup: StateActors, each loading the model itself
from the same folder, the batches dealt out of order, each actor running its share backwards,
every spec, job and result through pickle as Ray sends them) behind the very RayRows that
`--ray` uses. The graph must equal the one-process graph bit for bit: every node, edge, score
and check, compared as the JSON's shortest round-trip digits. A pool that moves one edge by one
unit in the last place is caught; one that splits the batches otherwise is not the same bit for
bit here (why the batches travel as one process forms them). tests/test_ray.py runs the command
on a real local cluster once."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch
from conftest import make_llama_folder, tiny_gpt2

from fptrace.commands.graph.core import graph
from fptrace.commands.graph.examples import write_transcoders
from fptrace.commands.graph.pool import Job, prepare, rows_of
from fptrace.commands.graph.ray import RayRows
from fptrace.commands.graph.rows import Rows
from fptrace.models.options import LoadOptions
from fptrace.models.ray_pool import StateActor
from fptrace.render.json import to_json

IDS = [5, 17, 42, 7, 9, 311]


def _copy(x):
    return pickle.loads(pickle.dumps(x))


class InProcessGroup:
    """ActorGroup's each/map in this process: `workers` StateActors (each its own model, loaded
    from `load`), each round's jobs dealt by a seeded shuffle, each actor running its share in
    reverse; what crosses goes through pickle. Records each round's jobs and who ran them."""

    def __init__(self, load: dict, workers: int, seed: int = 0) -> None:
        self.actors = [StateActor(load, torch.get_num_threads()) for _ in range(workers)]
        self.rng = np.random.default_rng(seed)
        self.prepared = 0
        self.rounds: list[list[int]] = []  # per round: each job's actor

    def each(self, make, spec):
        self.prepared += 1
        return [a.prepare(make, _copy(spec)) for a in self.actors]

    def map(self, work, jobs):
        order = self.rng.permutation(len(jobs))
        out: list = [None] * len(jobs)
        who = [0] * len(jobs)
        for w, actor in enumerate(self.actors):
            for j in reversed(order[w::len(self.actors)].tolist()):
                out[j] = _copy(actor.run(work, _copy(jobs[j])))
                who[j] = w
        self.rounds.append(who)
        return out

    def close(self) -> None:
        self.actors = []


def in_process(load: dict, workers: int = 3) -> RayRows:
    """RayRows, as `graph --ray` makes it, over InProcessGroup instead of a Ray cluster."""
    pool = RayRows.__new__(RayRows)
    pool.group = InProcessGroup(load, workers)  # type: ignore[assignment]
    pool._work, pool.calls = None, 0
    return pool


def same(a, b) -> bool:
    """Every figure of two graphs equal, bit for bit (the time taken aside)."""
    return to_json(dataclasses.replace(a, seconds=0.0), indent=None) == \
        to_json(dataclasses.replace(b, seconds=0.0), indent=None)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    load = dataclasses.asdict(LoadOptions(model=str(make_llama_folder(
        tmp_path_factory.mktemp("llama")))))
    return load, LoadOptions(**load).load()


@pytest.fixture(scope="module")
def gpt2():
    load = dataclasses.asdict(LoadOptions(model=tiny_gpt2()))
    return load, LoadOptions(**load).load()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("max_nodes", [10, 1000])  # ranked in rounds; every candidate at once
def test_the_graph_is_the_one_process_graph_bit_for_bit(family, max_nodes, request):
    load, lm = request.getfixturevalue(family)
    kw = {"max_nodes": max_nodes, "per_site": 2, "batch_size": 2, "node_threshold": 0.9}
    here = graph(lm, IDS, **kw)
    pool = in_process(load)
    there = graph(lm, IDS, pool=pool, **kw)
    assert here.ok and there.ok and here.computed == there.computed
    assert same(here, there)
    group = pool.group
    assert group.prepared == 1  # each actor made the frozen passes once for the graph
    assert pool.calls == sum(len(r) for r in group.rounds)  # every batch ran on the actors
    assert any(len(set(who)) > 1 for who in group.rounds)  # a round's batches spread out
    if max_nodes == 10:  # the ranking's rounds: the logits', then the candidates' (≥ 2)
        assert len(group.rounds) >= 3


def test_transcoders_and_verify_bit_for_bit(llama, tmp_path):
    """The workers read the transcoders' folder themselves; --verify runs here, on the rows the
    pool computed."""
    load, lm = llama
    folder = write_transcoders(str(tmp_path / "tc"), range(2), 64, d_sae=32, k=8)
    kw = {"transcoders": folder, "max_nodes": 8, "per_site": 3, "batch_size": 3, "verify": 2}
    here = graph(lm, IDS, **kw)
    there = graph(lm, IDS, pool=in_process(load, workers=2), **kw)
    assert here.ok and len(here.verified) == 2
    assert same(here, there)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_float32_rows_are_the_one_process_graph_bit_for_bit(family, request, tmp_path):
    """precision float32: the workers make float32 passes too (GraphWork.precision); the rows
    that miss are recomputed here, in float64, as in one process."""
    load, lm = request.getfixturevalue(family)
    d = lm.config.hidden_size
    folder = write_transcoders(str(tmp_path / "tc"), range(2), d, d_sae=32, k=8)
    for kw in ({"max_nodes": 10, "per_site": 2, "batch_size": 2},
               {"transcoders": folder, "max_nodes": 8, "per_site": 3, "batch_size": 3}):
        here = graph(lm, IDS, precision="float32", **kw)
        there = graph(lm, IDS, pool=in_process(load, workers=2), precision="float32", **kw)
        assert here.ok and here.precision == "float32"
        assert same(here, there)


def test_one_pool_serves_two_graphs(llama):
    """The actors keep the model; a new graph (another prompt) is prepared anew."""
    load, lm = llama
    pool = in_process(load, workers=2)
    for ids in (IDS, IDS[:4]):
        assert same(graph(lm, ids, max_nodes=6, per_site=2, pool=pool),
                    graph(lm, ids, max_nodes=6, per_site=2))
    assert pool.group.prepared == 2


class Nudged:
    """A broken pool: the first batch's rows computed right, then one edge moved by one unit in
    the last place."""

    def __init__(self, lm):
        self.lm, self.worker = lm, None

    def map(self, work, jobs):
        if self.worker is None:
            self.worker = prepare(self.lm, work)
        got = [rows_of(self.worker, j) for j in jobs]
        if not getattr(self, "done", False):
            self.done = True
            t = got[0].tokens.copy()
            t[0, 1] = np.nextafter(t[0, 1], np.inf)
            got[0] = dataclasses.replace(got[0], tokens=t)
        return got


class Resplit:
    """A pool that computes every target in a backward pass of its own (the rows of each batch
    stitched back together): the same numbers to ~1e-15, but other sums."""

    def __init__(self, lm):
        self.lm, self.worker = lm, None

    def map(self, work, jobs):
        if self.worker is None:
            self.worker = prepare(self.lm, work)
        out = []
        for job in jobs:
            one = [rows_of(self.worker, Job(job.end, (t,))) for t in job.targets]
            out.append(Rows(*(np.concatenate([getattr(r, f.name) for r in one])
                              for f in dataclasses.fields(Rows))))
        return out


def test_the_comparison_catches_one_ulp_and_other_batches(llama):
    _, lm = llama
    kw = {"max_nodes": 10, "per_site": 2, "batch_size": 4}
    here = graph(lm, IDS, **kw)
    assert not same(here, graph(lm, IDS, pool=Nudged(lm), **kw))
    other = graph(lm, IDS, pool=Resplit(lm), **kw)
    assert other.ok  # exact within the checks' tolerance ...
    for x, y in zip(here.edges, other.edges, strict=True):
        assert x.weight == pytest.approx(y.weight, rel=1e-9, abs=1e-15)
    # ... but not the same sums: the batches must travel as one process forms them (on this
    # machine's kernels; a CPU whose batched products sum alike for every batch would pass)
    if same(here, other):
        pytest.skip("this CPU's kernels give the same bits whatever the batch: nothing to see")


@pytest.mark.parametrize("args, says", [
    (["--ray", "auto", "--workers", "0"], "--workers"),
    (["--ray", "auto", "--workers", "\u00b2"], "--workers"),
    (["--ray", "auto", "--gpus-per-worker", "-1"], "--gpus-per-worker"),
    (["--ray", "auto", "--gpus-per-worker", "nan"], "--gpus-per-worker"),
    (["--ray", "127.0.0.1:1"], "--ray 127.0.0.1:1"),  # loopback: nothing answers at port 1
    (["--ray", ""], "--ray"),
])
def test_bad_ray_options_one_line_exit_2_nothing_written(args, says, tmp_path):
    from typer.testing import CliRunner

    from fptrace.cli.main import app

    out = tmp_path / "g.json"
    r = CliRunner().invoke(app, ["graph", "The cat sat", "-m", tiny_gpt2(), "--neurons",
                                 "--graph-json", str(out), *args])
    assert r.exit_code == 2, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("fptrace: error")]
    if "\u00b2" in args:  # click's own refusal (one line at the real entry point, as batch's)
        assert f"Invalid value for '{says}'" in r.stderr, r.stderr
    else:
        assert len(errors) == 1 and says in errors[0], r.stderr
    assert "loaded" not in r.stderr  # refused before the model was loaded
    assert not out.exists() and r.stdout == ""


def test_ray_without_the_extra_says_how_to_install(monkeypatch):
    import sys

    from typer.testing import CliRunner

    from fptrace.cli.main import app

    monkeypatch.setitem(sys.modules, "ray", None)  # as if `pip install "fptrace[ray]"` had not run
    r = CliRunner().invoke(app, ["graph", "The cat sat", "-m", tiny_gpt2(), "--neurons",
                                 "--ray", "auto"])
    assert r.exit_code == 2 and "loaded" not in r.stderr
    assert 'pip install "fptrace[ray]"' in r.stderr.strip().splitlines()[-1]


def test_an_actors_failure_is_one_line():
    """What a call on the actors raises, here: the actor's own FptraceError as it is (a
    transcoders folder missing on its node: exit 2), any other error or a dead actor as
    WorkerFailed (exit 1) with its first line."""
    exceptions = pytest.importorskip("ray.exceptions")
    from fptrace.errors import BadInput
    from fptrace.models.ray_pool import ActorGroup, WorkerFailed

    def raising(e):
        def fetch():
            raise e
        return fetch

    with pytest.raises(BadInput, match="no such folder"):
        ActorGroup._get(raising(exceptions.RayTaskError("run", "tb", BadInput("no such folder"))))
    with pytest.raises(WorkerFailed, match=r"a Ray worker failed: boom$|boom;"):
        ActorGroup._get(raising(exceptions.RayTaskError("run", "tb", ValueError("boom\nmore"))))
    with pytest.raises(WorkerFailed, match="RayActorError"):
        ActorGroup._get(raising(exceptions.RayActorError()))
    assert ActorGroup._get(lambda: [1, 2]) == [1, 2]


@pytest.mark.parametrize("path", ["ray_map", "ActorGroup"])
def test_more_gpus_per_worker_than_any_node_has_is_refused(path, monkeypatch):
    """--gpus-per-worker beyond every live node's GPUs: an actor no node can hold would wait
    forever, so both paths (batch's and stats' ray_map, graph's ActorGroup) refuse it in one
    line before asking for one; within what a node has, they ask. The cluster's view is
    stubbed here (a node of 1 GPU, a dead one of 8); tests/test_ray.py runs a real cluster."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")  # imported before ray.remote is stubbed: it uses it
    import fptrace.models.ray_pool as rp
    from fptrace.errors import BadInput

    monkeypatch.setattr(rp, "connect", lambda address: None)
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": {"GPU": 1.0}},
                                               {"Alive": False, "Resources": {"GPU": 8.0}}])
    def start(gpus):
        if path == "ray_map":
            return next(rp.ray_map([{"id": 1}], dict, address="auto", workers=1,
                                   gpus_per_worker=gpus, load={}, settings={}, rows_per_call=1,
                                   kept=str))
        return rp.ActorGroup(address="auto", workers=1, gpus_per_worker=gpus, load={})

    class Asked(Exception):
        pass

    def remote(*args, **kwargs):  # Ray asked for an actor
        raise Asked

    monkeypatch.setattr(ray, "remote", remote)
    monkeypatch.setattr(ray.data, "from_items", lambda rows: (_ for _ in ()).throw(Asked()))
    with pytest.raises(BadInput, match=r"^gpus_per_worker 2: no node of the Ray cluster has "
                                       r"that many GPUs \(the most: 1\)$"):
        start(2.0)
    with pytest.raises(Asked):
        start(1.0)


class FakeRef:
    """A fake Ray object reference: the call's result, or what ray.get raises."""

    def __init__(self, value=None, error=None) -> None:
        self.value, self.error = value, error


class FakeHandle:
    """A fake Ray actor handle over a StateActor in this process: its calls run at once,
    through pickle; after `calls` run calls (None: never) the actor dies, and every call on
    it from then on (that one included) gets ActorDiedError, as Ray's handle of a dead actor."""

    def __init__(self, actor: StateActor, dies_after: int | None, log: list) -> None:
        self.actor, self.dies_after, self.log, self.dead, self.ran = actor, dies_after, log, \
            False, 0
        self.prepare = self._method("prepare")
        self.run = self._method("run")

    def _method(self, name: str):
        from ray.exceptions import ActorDiedError

        handle = self

        class Method:
            @staticmethod
            def remote(fn, arg):
                if name == "run" and handle.dies_after is not None \
                        and handle.ran == handle.dies_after:
                    handle.dead = True
                if handle.dead:
                    handle.log.append(("died", name))
                    return FakeRef(error=ActorDiedError())
                handle.ran += name == "run"
                arg = arg.value if isinstance(arg, FakeRef) else arg
                return FakeRef(_copy(getattr(handle.actor, name)(fn, _copy(arg))))

        return Method


class FakeRay:
    """What ActorGroup asks of `ray`, in this process: actors (ray.remote(StateActor)), put,
    get, wait (the calls returned in a seeded shuffled order), kill. `deaths`: for each actor
    started, in the order started, after how many run calls it dies (None: never)."""

    def __init__(self, deaths: list, seed: int = 0) -> None:
        self.deaths, self.started, self.log = list(deaths), [], []
        self.rng = np.random.default_rng(seed)

    def remote(self, cls):
        fake = self

        class Remote:
            @staticmethod
            def options(**kw):
                return Remote

            @staticmethod
            def remote(*args):
                dies = fake.deaths.pop(0) if fake.deaths else None
                h = FakeHandle(cls(*args), dies, fake.log)
                fake.started.append(h)
                return h

        return Remote

    def put(self, x):
        return FakeRef(x)

    def get(self, ref):
        if isinstance(ref, list):
            return [self.get(r) for r in ref]
        if ref.error is not None:
            raise ref.error
        return ref.value

    def wait(self, refs, num_returns=1):
        i = int(self.rng.integers(len(refs)))
        return [refs[i]], refs[:i] + refs[i + 1:]

    def kill(self, handle):
        handle.dead = True


def fake_ray(monkeypatch, deaths: list) -> FakeRay:
    """FakeRay in place of the cluster: `ray`'s functions that ActorGroup calls replaced."""
    ray = pytest.importorskip("ray")
    import fptrace.models.ray_pool as rp

    fake = FakeRay(deaths)
    for name in ("remote", "put", "get", "wait", "kill"):
        monkeypatch.setattr(ray, name, getattr(fake, name))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {})
    monkeypatch.setattr(rp, "connect", lambda address: None)
    return fake


def fake_cluster(monkeypatch, load: dict, workers: int, deaths: list) -> tuple[RayRows, FakeRay]:
    """RayRows as `graph --ray` makes it, its ActorGroup the real one, over FakeRay."""
    fake = fake_ray(monkeypatch, deaths)
    return RayRows(address="auto", workers=workers, gpus_per_worker=None, load=load), fake


@pytest.mark.parametrize("workers", [1, 2])
def test_an_actor_that_dies_mid_graph_is_replaced_and_its_batch_run_again(llama, workers,
                                                                          monkeypatch):
    """An actor that dies during the graph's rounds (here after its third batch): its batch
    runs once more, on another actor or on the replacement (which loads the model and makes
    the frozen passes first), and the graph is the one-process graph bit for bit."""
    load, lm = llama
    kw = {"max_nodes": 10, "per_site": 2, "batch_size": 2, "node_threshold": 0.9}
    here = graph(lm, IDS, **kw)
    pool, fake = fake_cluster(monkeypatch, load, workers, [3])
    there = graph(lm, IDS, pool=pool, **kw)
    assert ("died", "run") in fake.log and pool.group.replaced == 1
    assert len(fake.started) == workers + 1 and fake.started[-1].ran > 0
    assert here.ok and same(here, there)


def test_an_actor_that_dies_while_preparing_is_replaced(llama, monkeypatch):
    """An actor that dies before it has made the frozen passes (its first call, prepare)."""
    load, lm = llama
    kw = {"max_nodes": 6, "per_site": 2}
    pool, fake = fake_cluster(monkeypatch, load, 2, [])
    pool.group.actors[1].dead = True  # dead before its first call
    assert same(graph(lm, IDS, **kw), graph(lm, IDS, pool=pool, **kw))
    assert ("died", "prepare") in fake.log and pool.group.replaced == 1


def test_a_batch_whose_second_try_dies_too_stops_in_one_line(llama, monkeypatch, tmp_path):
    """The replacement dies on the same batch: the graph stops with WorkerFailed (exit 1),
    one line that says so; through the command line nothing is written."""
    from typer.testing import CliRunner

    from fptrace.cli.main import app
    from fptrace.models.ray_pool import WorkerFailed

    load, lm = llama
    pool, _ = fake_cluster(monkeypatch, load, 1, [1, 0])
    with pytest.raises(WorkerFailed, match=r"second try too .*; nothing was written$") as e:
        graph(lm, IDS, max_nodes=6, per_site=2, batch_size=2, pool=pool)
    assert WorkerFailed.exit_code == 1 and "\n" not in str(e.value)
    fake_ray(monkeypatch, [1, 0])
    out = tmp_path / "g.json"
    r = CliRunner().invoke(app, ["graph", "The cat sat on", "-m", load["model"], "--neurons",
                                 "--max-nodes", "6", "--ray", "auto", "--graph-json", str(out)])
    assert r.exit_code == 1, r.output
    last = r.stderr.strip().splitlines()[-1]  # before it: the loading's lines
    assert last.startswith("fptrace: error:") and "second try too" in last
    assert r.stderr.count("error") == 1
    assert not out.exists() and r.stdout == ""
