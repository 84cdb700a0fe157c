"""Work on many prompts spread over a Ray cluster: a pool of actors, each loading the model once.

Ray Data does the scheduling: a dataset of rows (plain values: ids, prompts as JSON, ...),
`map_batches` with a callable class that loads the model once per actor (an actor pool of
--workers, --gpus-per-worker each) and runs a command's work function on each block of rows,
and the results stream back to the driver in input order (`iter_batches`). An actor that dies is
restarted and its block retried by Ray; when a block keeps failing, the driver stops with
WorkerFailed and keeps what it already has. `batch --ray` hands it groups of prompts to trace,
`stats --ray` shards of prompts whose statistics come back to be merged.

Work whose calls share a state (`graph --ray`: a prompt's frozen passes, made once per actor and
read by every batch of backward passes) runs on an ActorGroup instead: Ray's actors (StateActor,
each loading the model once, computing on as many torch threads as this process), `each` to
prepare every actor's state, `map` to hand the calls out to the actors free and have their
results back in the calls' order. An actor that dies during `map` is replaced by a new one
(loading the model, then prepared as `each` prepared the others) and its call is run once more,
on whichever actor is free first; a call whose second run fails too (or an actor that cannot be
replaced) stops the work with WorkerFailed, nothing kept.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from fptrace.errors import BadInput, FptraceError, param
from fptrace.numbers import check_finite, is_int

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

S = TypeVar("S")  # what an actor is prepared with (a spec)
T = TypeVar("T")  # an actor's state, made of its model and a spec
J = TypeVar("J")  # a job
R = TypeVar("R")  # a job's result


class WorkerFailed(FptraceError):
    exit_code = 1


class ModelActor:
    """One Ray actor: loads the model once, then runs work(lm, block, **settings) on each block
    of rows it is handed (a dict of columns) and returns its result (a dict of columns)."""

    def __init__(self, load: dict, work: Callable[..., dict], settings: dict) -> None:
        from fptrace.models.options import LoadOptions

        self.lm = LoadOptions(**load).load()
        self.work = work
        self.settings = settings

    def __call__(self, block: dict) -> dict:
        return self.work(self.lm, block, **self.settings)


class StateActor:
    """One Ray actor of an ActorGroup: loads the model once, computing on `threads` torch
    threads (the driver's: a matrix product's summation order follows its threads); then
    prepare(make, spec) keeps make(lm, spec) as its state and run(work, job) returns
    work(state, job)."""

    def __init__(self, load: dict, threads: int) -> None:
        import torch

        from fptrace.models.options import LoadOptions

        torch.set_num_threads(threads)
        self.lm = LoadOptions(**load).load()
        self.state: object = None

    def prepare(self, make: Callable[[LoadedModel, S], object], spec: S) -> int:
        self.state = None  # the last state freed before the next is made
        self.state = make(self.lm, spec)
        return os.getpid()

    def run(self, work: Callable[[T, J], R], job: J) -> R:
        return work(cast(T, self.state), job)


class ActorGroup:
    """`workers` StateActors on the Ray cluster at `address` (connect), each with
    `gpus_per_worker` GPUs (None: 1 where the cluster has GPUs, else 0) and the model that
    `load` (LoadOptions' fields) loads; their loading starts at once. close() (or the end of a
    `with`) ends them. A call that fails on an actor raises its FptraceError here, or
    WorkerFailed; a call whose actor died is run once more on a replacement (the module's
    text)."""

    def __init__(self, *, address: str, workers: int, gpus_per_worker: float | None,
                 load: dict) -> None:
        check_workers(workers, gpus_per_worker)
        connect(address)
        import ray
        import torch

        gpus_per_worker = _gpus(gpus_per_worker)
        self._actor = ray.remote(StateActor).options(num_gpus=gpus_per_worker, max_restarts=0)
        self._start = (load, torch.get_num_threads())
        self._prepared: tuple | None = None  # (make, the spec's reference) of the last each
        self.replaced = 0  # actors that died and were replaced
        # Ray's handles: their methods' .remote() is not in its type hints
        self.actors: list = [self._new() for _ in range(workers)]

    def _new(self) -> object:
        """A new actor, loading the model (and, after an `each`, prepared as the others)."""
        made: list = [self._actor.remote(*self._start)]  # a Ray handle (untyped: see actors)
        if self._prepared is not None:
            made[0].prepare.remote(*self._prepared)  # runs before any call it is handed later
        return made[0]

    def each(self, make: Callable[[LoadedModel, S], object], spec: S) -> list[int]:
        """make(lm, spec) on every actor, kept as its state (spec sent once); the actors'
        process ids. An actor that died there is replaced and the new one prepared."""
        import ray
        import ray.exceptions

        ref = ray.put(spec)
        self._prepared = None
        calls = [a.prepare.remote(make, ref) for a in self.actors]
        got: list = []  # the process ids (ray.get of a handle's call: untyped)
        for k, call in enumerate(calls):
            try:
                got.append(self._get(functools.partial(ray.get, call)))
            except WorkerFailed as e:  # an actor died: replaced, and prepared once more
                if not isinstance(e.__context__, ray.exceptions.RayActorError):
                    raise
                dead, self.actors[k] = self.actors[k], self._actor.remote(*self._start)
                self.replaced += 1
                with contextlib.suppress(Exception):
                    ray.kill(dead)
                again = self.actors[k].prepare.remote(make, ref)
                got.append(self._get(functools.partial(ray.get, again)))
        self._prepared = (make, ref)
        return got

    def map(self, work: Callable[[T, J], R], jobs: list[J]) -> list[R]:
        """work(state, job) for every job, each on the next actor free; the results in the
        jobs' order. A job whose actor died runs once more (the module's text)."""
        import ray
        import ray.exceptions

        out: list = [None] * len(jobs)
        todo = list(range(len(jobs)))[::-1]  # popped from the end: the jobs' order
        free = list(self.actors)
        running: dict = {}  # a call's reference -> (its job, its actor)
        again: set[int] = set()  # the jobs run a second time
        while todo or running:
            while todo and free:
                i, actor = todo.pop(), free.pop(0)
                running[actor.run.remote(work, jobs[i])] = (i, actor)
            ready, _ = ray.wait(list(running), num_returns=1)
            i, actor = running.pop(ready[0])
            try:
                out[i] = self._get(functools.partial(ray.get, ready[0]))
                free.append(actor)
            except WorkerFailed as e:
                if not isinstance(e.__context__, ray.exceptions.RayActorError):
                    raise
                if i in again:
                    first = e.args[0].removesuffix("; nothing was written")
                    raise WorkerFailed(f"{first}, on its call's second try too (the first's "
                                       "actor died); nothing was written") from None
                again.add(i)
                todo.append(i)  # next, on whichever actor is free first
                new = self._new()
                self.actors[self.actors.index(actor)] = new
                self.replaced += 1
                free.append(new)
                with contextlib.suppress(Exception):
                    ray.kill(actor)
        return out

    @staticmethod
    def _get(fetch: Callable[[], R]) -> R:
        import ray.exceptions

        try:
            return fetch()
        except ray.exceptions.RayTaskError as e:  # the call raised: a mistake of the input's?
            if isinstance(e.cause, FptraceError):
                raise e.cause from None
            raise WorkerFailed(f"a Ray worker failed: {_first(e.cause or e)}; nothing was "
                               "written") from None
        except ray.exceptions.RayError as e:  # an actor died, or could not start
            raise WorkerFailed(f"a Ray worker failed ({type(e).__name__}: {_first(e)}); "
                               "nothing was written") from None

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []

    def __enter__(self) -> ActorGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _gpus(gpus_per_worker: float | None) -> float:
    """--gpus-per-worker, or where not given 1 when the connected cluster has GPUs, else 0;
    refused where no live node of the connected cluster has that many (an actor no node can
    hold would wait forever: the command would hang)."""
    import ray

    if gpus_per_worker is None:
        return 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    most = max((n["Resources"].get("GPU", 0) for n in ray.nodes() if n.get("Alive")),
               default=0)
    if gpus_per_worker > most:
        raise BadInput(f"{param('gpus_per_worker')} {gpus_per_worker:g}: no node of the Ray "
                       f"cluster has that many GPUs (the most: {most:g})")
    return gpus_per_worker


def _first(e: BaseException) -> str:
    """An exception's first line, at most 200 characters, or its type's name."""
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def check_workers(workers: int, gpus_per_worker: float | None) -> None:
    """--workers at least 1, --gpus-per-worker (where given) a finite number, 0 or more."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise BadInput(f"{param('workers')} {workers!r}: must be at least 1 (actors, each loading "
                       f"the "
                       "model once)")
    if gpus_per_worker is not None:
        check_finite(float(gpus_per_worker), param("gpus_per_worker"), low=0.0)


def check_address(address: str) -> None:
    """--ray before anything is loaded: Ray installed, and auto or an address at which
    something answers (connect, later, joins it)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise BadInput(f"{param('ray')} needs Ray: pip install \"fptrace[ray]\"")
    if not address.strip():
        raise BadInput(f"{param('ray')} '': give auto or the cluster's address (HOST:PORT)")
    if address != "auto":
        try:
            _reachable(address)
        except ConnectionError as e:
            raise BadInput(f"{param('ray')} {address}: cannot reach the Ray cluster "
                           f"({e})") from None


def connect(address: str) -> Any:
    """ray.init: `auto` joins the cluster that `ray start` or RAY_ADDRESS names, else starts
    a local one; anything else is the address of an existing cluster."""
    try:
        import ray
    except ImportError:
        raise BadInput(f"{param('ray')} needs Ray: pip install \"fptrace[ray]\"") from None
    import logging

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    for name in ("ray", "ray.data"):  # Ray's own messages: errors only, and on stderr
        logging.getLogger(name).setLevel(logging.ERROR)
    init = functools.partial(ray.init, include_dashboard=False, log_to_driver=False,
                             logging_level=logging.ERROR, configure_logging=True)  # quiet
    if ray.is_initialized():
        return ray
    try:
        if address == "auto":
            try:
                init(address="auto")
            except (ConnectionError, RuntimeError, ValueError):
                init()  # no cluster running: a local one, stopped at exit
        else:
            _reachable(address)
            init(address=address)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadInput(f"{param('ray')} {address}: cannot reach the Ray cluster "
                       f"({first[:200]})") from None
    return ray


def _reachable(address: str) -> None:
    """Fail at once, not after Ray's minutes of retries, when nothing listens at HOST:PORT."""
    import socket

    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not is_int(port) or int(port) < 0:
        return
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as e:
        raise ConnectionError(f"nothing answers at {host}:{port} ({e.strerror or e})") from None


def ray_map(rows: list[dict], work: Callable[..., dict], *, address: str, workers: int,
            gpus_per_worker: float | None, load: dict, settings: dict, rows_per_call: int,
            kept: Callable[[], str]) -> Iterator[dict]:
    """work(lm, block, **settings) on every block of `rows_per_call` rows, on `workers` actors
    that each load the model (`load`: LoadOptions' fields) once; yields each block's result,
    in input order. A block that keeps failing ends the iteration with WorkerFailed, whose
    message ends with kept() (what the caller has kept so far)."""
    check_workers(workers, gpus_per_worker)
    if not rows:
        return
    connect(address)
    import ray.data  # binds `ray` too

    gpus_per_worker = _gpus(gpus_per_worker)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # results come back in input order
    ds = ray.data.from_items(rows).map_batches(
        ModelActor, batch_size=rows_per_call, batch_format="default",
        compute=ray.data.ActorPoolStrategy(size=workers), num_gpus=gpus_per_worker,
        fn_constructor_kwargs={"load": load, "work": work, "settings": settings},
        max_restarts=2, max_task_retries=2)
    try:
        yield from ds.iter_batches(batch_size=None, batch_format="default")
    except (FptraceError, KeyboardInterrupt):
        raise
    except Exception as e:  # a block that kept failing: stop, keep what is done
        raise WorkerFailed(f"the Ray workers failed ({type(e).__name__}: {_first(e)}); "
                           f"{kept()}") from None


__all__ = ["ActorGroup", "ModelActor", "StateActor", "WorkerFailed", "check_address",
           "check_workers", "connect", "ray_map"]
