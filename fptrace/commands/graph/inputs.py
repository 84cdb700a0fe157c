"""The options of `fptrace graph`, checked before the model is loaded (one line on stderr,
exit 2, nothing written): the thresholds are fractions in [0, 1], the counts positive whole
numbers (--verify and --qk 0 or more), the graph file a path fptrace may write, and one of --neurons
and --transcoders DIR given (DIR a folder that exists; its transcoders are read and checked
against the model in transcoders.py); --workers at least 1, --gpus-per-worker 0 or more, and
something answering at --ray's address (models/ray_pool: as batch and stats check them);
--precision float64 or float32 (not with --verify or --qk). The
query positions arrive parsed (cli.py, through fptrace.addresses) and are resolved against the
prompt in core.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fptrace.errors import BadInput, param
from fptrace.numbers import parse_float, parse_int

PRECISIONS = ("float64", "float32")  # --precision: the dtype of the candidate rows


@dataclass(frozen=True)
class GraphRequest:
    """The options of one `fptrace graph`, checked."""

    node_threshold: float
    edge_threshold: float
    max_nodes: int
    per_site: int
    positions: Any  # a Selection, or None for the last position
    transcoders: str | None  # the folder, or None for --neurons
    verify: int = 0  # nodes removed one at a time (--verify)
    qk: int = 0  # head shares whose attention score is split (--qk)
    precision: str = "float64"  # the candidate rows' dtype (--precision)


def check_request(*, neurons: bool, node_threshold: str, edge_threshold: str,
                  max_nodes: str, per_site: str, positions: Any, graph_json: str | None,
                  force: bool, transcoders: str | None = None, verify: str = "0",
                  qk: str = "0", workers: int = 1, gpus_per_worker: float | None = None,
                  ray: str | None = None, precision: str = "float64") -> GraphRequest:
    """The request, or BadInput naming the option at fault (positions: a Selection parsed by
    the command line, or None)."""
    check_nodes(neurons, transcoders)
    node = parse_float(str(node_threshold), param("node_threshold"), low=0.0, high=1.0)
    edge = parse_float(str(edge_threshold), param("edge_threshold"), low=0.0, high=1.0)
    n_max = parse_int(str(max_nodes), param("max_nodes"), low=1)
    k = parse_int(str(per_site), param("per_site"), low=1)
    n_verify = parse_int(str(verify), param("verify"), low=0)
    n_qk = parse_int(str(qk), param("qk"), low=0)
    check_precision(precision, n_verify, n_qk)
    from fptrace.models.ray_pool import check_address, check_workers

    check_workers(workers, gpus_per_worker)
    if ray is not None:
        check_address(ray)
    if graph_json is not None:
        from fptrace.atomic import check_target

        if not graph_json.lower().endswith(".json"):
            raise BadInput(f"{param('graph_json')} {graph_json}: give a .json file name")
        check_target(graph_json, "--graph-json", "graph.json", force)
    return GraphRequest(node_threshold=node, edge_threshold=edge, max_nodes=n_max, per_site=k,
                        positions=positions, transcoders=transcoders, verify=n_verify,
                        qk=n_qk, precision=precision)


def check_precision(precision: str, verify: int, qk: int) -> None:
    """--precision: float64 (every row), or float32 (the candidate rows, each checked and
    recomputed in float64 where it misses: core.py), without --verify and --qk, whose checks
    hold float64 interventions and splits to the rows' edges one by one."""
    if precision not in PRECISIONS:
        raise BadInput(f"{param('precision')} {precision!r}: give "
                       + " or ".join(PRECISIONS))
    if precision != "float64" and (verify or qk):
        raise BadInput(f"{param('precision')} {precision}: {param('verify')} and {param('qk')} "
                       "check each edge of every computed row against float64 interventions; "
                       f"give them with {param('precision')} float64")


def check_nodes(neurons: bool, transcoders: str | None) -> None:
    """One kind of node: --neurons, or --transcoders DIR with DIR a folder (read and checked
    against the model in transcoders.py)."""
    import os

    if neurons and transcoders is not None:
        raise BadInput(f"graph: {param('neurons')} and {param('transcoders')} both given: the "
                       f"nodes are either the "
                       "model's own MLP neurons or the transcoders' latents; pass one")
    if not neurons and transcoders is None:
        raise BadInput(f"graph: pass {param('neurons')} (the nodes are the model's own MLP "
                       f"neurons) or "
                       f"{param('transcoders')} DIR (the latents of per-block transcoders)")
    if transcoders is not None and not os.path.isdir(transcoders):
        raise BadInput(f"{param('transcoders')} {transcoders!r}: no such folder (give the folder "
                       f"of "
                       f"per-block transcoders, as `fptrace features train {param('transcoder')}` "
                       f"writes "
                       "it)")


__all__ = ["PRECISIONS", "GraphRequest", "check_nodes", "check_precision", "check_request"]
