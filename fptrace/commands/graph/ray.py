"""`fptrace graph --ray ADDRESS|auto --workers N`: the graph's backward passes on a Ray cluster.

A RowsPool (pool.py) over models/ray_pool.py's ActorGroup: N actors, each loading the model once
(their loading starts when the pool is made, while this process loads its own), computing on as
many torch threads as this process. For a graph, every actor first makes the same frozen passes
from the same GraphWork (`prepare`: the prompt's ids, the query positions, the candidates, the
transcoders' folder); then each round's batches of targets, formed here exactly as one process
forms them, go out to the actors free, one batch a call, and their Rows come back in the batches'
order: the one-process graph, bit for bit, where the actors compute as this process does (the
same weights, the same kind of device, the same thread count). The ranking (circuit-tracer's
max_feature_nodes: a round's candidates follow from the rows of the rounds before) stays here;
only a round's batches are spread. Ray's own messages go to its logs (models/ray_pool.connect):
stdout stays the graph's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from fptrace.commands.graph.pool import GraphWork, Job, prepare, rows_of
from fptrace.commands.graph.rows import Rows

if TYPE_CHECKING:
    from fptrace.models.options import LoadOptions


class RayRows:
    """A RowsPool on a Ray cluster's actors (see the module's text); close() ends them (or the
    end of a `with`)."""

    def __init__(self, *, address: str, workers: int, gpus_per_worker: float | None,
                 load: dict) -> None:
        from fptrace.models.ray_pool import ActorGroup

        self.group = ActorGroup(address=address, workers=workers,
                                gpus_per_worker=gpus_per_worker, load=load)
        self._work: GraphWork | None = None
        self.calls = 0  # batches computed on the actors

    def map(self, work: GraphWork, jobs: Sequence[Job]) -> list[Rows]:
        if work is not self._work:  # a new graph: every actor makes its frozen passes
            self._work = None
            self.group.each(prepare, work)
            self._work = work
        self.calls += len(jobs)
        return self.group.map(rows_of, list(jobs))

    def close(self) -> None:
        self.group.close()

    def __enter__(self) -> RayRows:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def ray_rows(address: str | None, workers: int, gpus_per_worker: float | None,
             opts: LoadOptions) -> Iterator[RayRows | None]:
    """The command line's pool: RayRows on the cluster at `address` whose actors load the model
    as `opts` (LoadOptions) says, ended on leaving; None (this process) without an address."""
    if address is None:
        yield None
        return
    import dataclasses

    with RayRows(address=address, workers=workers, gpus_per_worker=gpus_per_worker,
                 load=dataclasses.asdict(opts)) as pool:
        yield pool


__all__ = ["RayRows", "ray_rows"]
