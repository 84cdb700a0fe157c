"""Work on many prompts spread over a Ray cluster: a pool of actors, each loading the model once.

Ray Data does the scheduling: a dataset of rows (plain values: ids, prompts as JSON, ...),
`map_batches` with a callable class that loads the model once per actor (an actor pool of
--workers, --gpus-per-worker each) and runs a command's work function on each block of rows,
and the results stream back to the driver in input order (`iter_batches`). An actor that dies is
restarted and its block retried by Ray; when a block keeps failing, the driver stops with
WorkerFailed and keeps what it already has. `batch --ray` hands it groups of prompts to trace,
`stats --ray` shards of prompts whose statistics come back to be merged.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

from fptrace.errors import BadInput, FptraceError
from fptrace.numbers import is_int


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


def connect(address: str) -> Any:
    """ray.init: `auto` joins the cluster that `ray start` or RAY_ADDRESS names, else starts
    a local one; anything else is the address of an existing cluster."""
    try:
        import ray
    except ImportError:
        raise BadInput("--ray needs Ray: pip install \"fptrace[ray]\"") from None
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
        raise BadInput(f"--ray {address}: cannot reach the Ray cluster ({first[:200]})") from None
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
    if workers < 1:
        raise BadInput("--workers must be at least 1")
    if not rows:
        return
    connect(address)
    import ray.data  # binds `ray` too

    if gpus_per_worker is None:
        gpus_per_worker = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
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
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise WorkerFailed(f"the Ray workers failed ({type(e).__name__}: {first[:200]}); "
                           f"{kept()}") from None


__all__ = ["ModelActor", "WorkerFailed", "connect", "ray_map"]
