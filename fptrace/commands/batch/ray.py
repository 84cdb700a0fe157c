"""Many prompts on a Ray cluster: `fptrace batch INPUTS --out F --ray auto|ADDRESS`.

Ray Data does the scheduling: a dataset of the prompts still to do, `map_batches` with a
callable class that loads the model once per actor (an actor pool of --workers, --gpus-per-worker
each) and traces each group with the same batched tracer as a local batch (`run_batch`), and
the records stream back to the driver in input order (`iter_batches`), which writes them through
the same resumable writer. An actor that dies is restarted and its group retried by Ray; when a
group keeps failing, the batch stops there with every finished record written, and rerunning
the command finishes the rest.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from fptrace.commands.batch.core import (
    PromptItem,
    Summary,
    prompt_from_json,
    prompt_to_json,
    run_batch,
)
from fptrace.errors import BadInput, FptraceError


class TraceActor:
    """One Ray actor: loads the model once, then traces each group it is handed."""

    def __init__(self, load: dict, settings: dict) -> None:
        from fptrace.models.options import LoadOptions

        self.lm = LoadOptions(**load).load()
        self.settings = settings

    def __call__(self, batch: dict) -> dict:
        items = [PromptItem(id=i, source=s, prompt=prompt_from_json(p), extra=json.loads(e),
                            error=err or None)
                 for i, s, p, e, err in zip(batch["id"], batch["source"], batch["prompt"],
                                            batch["extra"], batch["error"])]
        lines: list[str] = []
        summary = run_batch(self.lm, items, lines.extend, set(),
                            batch_size=len(items), **self.settings)
        return {"index": list(batch["index"]), "line": lines,
                "traced": [summary.traced] + [0] * (len(lines) - 1),
                "failed": [summary.failed] + [0] * (len(lines) - 1),
                "tokens": [summary.tokens] + [0] * (len(lines) - 1)}


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
    quiet = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 configure_logging=True)
    if ray.is_initialized():
        return ray
    try:
        if address == "auto":
            try:
                ray.init(address="auto", **quiet)
            except (ConnectionError, RuntimeError, ValueError):
                ray.init(**quiet)  # no cluster running: a local one, stopped at exit
        else:
            _reachable(address)
            ray.init(address=address, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadInput(f"--ray {address}: cannot reach the Ray cluster ({first[:200]})") from None
    return ray


def _reachable(address: str) -> None:
    """Fail at once, not after Ray's minutes of retries, when nothing listens at HOST:PORT."""
    import socket

    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as e:
        raise ConnectionError(f"nothing answers at {host}:{port} ({e.strerror or e})") from None


def run_on_ray(items: list[PromptItem], done: set[str], write: Callable[[list[str]], None], *,
               address: str, workers: int, gpus_per_worker: float | None, load: dict,
               batch_size: int, top_k: int, snippet: int, truncate: bool,
               progress: Callable[[int, int], None] | None = None) -> Summary:
    """Trace every item not in `done` on the cluster; hand each group's lines to `write` in
    input order."""
    import time

    if workers < 1:
        raise BadInput("--workers must be at least 1")
    ray = connect(address)
    import ray.data

    todo = [it for it in items if it.id not in done]
    s = Summary(total=len(items), skipped=len(items) - len(todo))
    if not todo:
        return s
    if gpus_per_worker is None:
        gpus_per_worker = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # records come back in input order
    rows = [{"index": k, "id": it.id, "source": it.source, "prompt": prompt_to_json(it.prompt),
             "extra": json.dumps(it.extra), "error": it.error or ""}
            for k, it in enumerate(todo)]
    ds = ray.data.from_items(rows).map_batches(
        TraceActor, batch_size=batch_size, batch_format="default",
        compute=ray.data.ActorPoolStrategy(size=workers), num_gpus=gpus_per_worker,
        fn_constructor_kwargs={"load": load, "settings": {
            "top_k": top_k, "snippet": snippet, "truncate": truncate}},
        max_restarts=2, max_task_retries=2)
    start = time.perf_counter()
    written = 0
    try:
        for batch in ds.iter_batches(batch_size=None, batch_format="default"):
            lines = list(batch["line"])
            write(lines)
            written += len(lines)
            s.traced += int(sum(batch["traced"]))
            s.failed += int(sum(batch["failed"]))
            s.tokens += int(sum(batch["tokens"]))
            if progress is not None:
                progress(len(lines), int(sum(batch["tokens"])))
    except KeyboardInterrupt:
        s.interrupted = True
    except FptraceError:
        raise
    except Exception as e:  # a group that kept failing: stop, keep what is written
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise WorkerFailed(f"the Ray workers failed ({type(e).__name__}: {first[:200]}); "
                           f"{written} of {len(todo)} records were written and are kept: "
                           "rerun the same command to finish the rest") from None
    finally:
        s.seconds = time.perf_counter() - start
    return s


class WorkerFailed(FptraceError):
    exit_code = 1


__all__ = ["run_on_ray", "connect", "TraceActor", "WorkerFailed"]
