"""Where a graph's backward passes run: the seam between core.py, which decides which batches
of targets are computed, in which rounds and in which order, and what computes them (this
process, or the actors of a Ray cluster: ray.py).

A Job is one batch of targets and the prefix whose frozen pass serves it, formed exactly as one
process forms it; a RowsPool's `map(work, jobs)` returns the jobs' Rows in the jobs' order,
wherever and in whatever order it computed them, and core.py assembles them as it assembles its
own. A worker makes the graph's frozen passes from GraphWork (the prompt's ids, the query
positions, the candidates, the transcoders) on its own float64 copy of the same model
(`prepare`), then computes each job it is handed (`rows_of`): the same rows() of the same batch
on the same pass as one process, so the same sums in the same order. The graph is then the
one-process graph bit for bit wherever the workers compute as this process does: the same
weights, the same kind of device and the same torch thread count (a matrix product's summation
order follows its threads; ray.py sets the actors' count to this process's). The rows are
checked here in any case (core.py's graph_sums: every node's edges plus its bias terms against
this process's own float64 value).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from fptrace.commands.graph.passes import FrozenPasses, copied_passes
from fptrace.commands.graph.rows import Candidates, Rows, Target, rows

if TYPE_CHECKING:
    from fptrace.commands.graph.transcoders import TranscoderSet
    from fptrace.models.loading import LoadedModel


@dataclass(frozen=True)
class Job:
    """One backward pass: a batch of targets, and the prefix whose frozen pass serves them."""

    end: int  # the pass of the prompt's first `end` positions (core.prefix_ends)
    targets: tuple[Target, ...]


@dataclass(frozen=True)
class GraphWork:
    """What a worker needs to make a graph's frozen passes as this process makes them."""

    ids: tuple[int, ...]  # the prompt's token ids, up to the last query position
    queries: tuple[int, ...]  # the query positions (the whole pass keeps their logits)
    cand: Candidates  # the candidates, whose edges rows() keeps one by one
    # the transcoders as graph() was given them: a folder (each worker reads it: it must be
    # there for the workers too, as the model is) or a TranscoderSet; None for --neurons
    transcoders: str | TranscoderSet | None
    precision: str = "float64"  # the rows' dtype (core.graph's precision; float32 rows are
    # checked, and those that miss recomputed in float64, where the graph is built)


class RowsPool(Protocol):
    """What computes a graph's batches of rows elsewhere (graph(pool=...))."""

    def map(self, work: GraphWork, jobs: Sequence[Job]) -> Iterable[Rows]:
        """The Rows of each job, in the jobs' order."""
        ...


@dataclass
class Worker:
    """A worker's state for one graph: its frozen passes and the candidates."""

    passes: FrozenPasses
    cand: Candidates


def prepare(lm: LoadedModel, work: GraphWork) -> Worker:
    """A worker's state for `work` on its model lm (loaded as the graph's own)."""
    from fptrace.commands.graph.freezing import mlp_sites
    from fptrace.commands.graph.transcoders import read_transcoders

    tset = work.transcoders
    if isinstance(tset, str):
        tset = read_transcoders(tset, lm)
    sites = mlp_sites(lm.parts.family) if tset is None else None
    return Worker(copied_passes(lm, work.precision, sites, tset, list(work.ids),
                                list(work.queries)), work.cand)


def rows_of(worker: Worker, job: Job) -> Rows:
    """The Rows of one job: one batched backward pass through its prefix's frozen pass."""
    return rows(worker.passes(job.end), list(job.targets), worker.cand)


__all__ = ["GraphWork", "Job", "RowsPool", "Worker", "prepare", "rows_of"]
