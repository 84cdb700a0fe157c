"""The graph on the page (`fptrace report --graph`, `fptrace graph --html FILE`): the terminal
view, and a blocks × positions map of the pruned graph: a cell's colour is the influence on the
logits of the nodes kept at that block and position (neurons or latents, remainders, error
nodes), its label how many neurons or latents are kept there, and its hover each of those nodes
with its value, its influence and its strongest edges in and out (weights exact, from the
graph). A click on a row opens that block. Beside it the graph drawn as nodes and edges
(render/pagedata.py's NodeGraph, drawn by pagegraph.js): each kept node at (block, position),
its edges on hover, its activation at every position and its effect on each logit on click."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fptrace.cli.options import STATS
from fptrace.cli.sections import Page, ReportSection
from fptrace.render.html import section

if TYPE_CHECKING:
    from fptrace.commands.graph.result import AttributionGraph, GraphEdge, GraphNode
    from fptrace.render.pagedata import NodeGraph, SectionData
    from fptrace.results import Token

EDGES_SHOWN = 3  # the strongest edges in and out a node's hover lists
EDGES_DRAWN = 300  # the drawing's strongest edges drawn before more are asked for

OPTIONS = (
    ("graph", Annotated[bool, typer.Option(
        "--graph", help="Add the attribution graph of the next token over the model's own MLP "
        "neurons (as `fptrace graph --neurons`; --graph-transcoders DIR: over transcoders).",
        rich_help_panel=STATS)], False),
    ("graph_transcoders", Annotated[str | None, typer.Option(
        "--graph-transcoders", metavar="DIR", help="With --graph: the graph over the per-block "
        "transcoders in DIR (as `fptrace graph --transcoders DIR`).",
        rich_help_panel=STATS)], None),
)


def _check(values: dict[str, Any]) -> None:
    from fptrace.commands.graph.inputs import check_nodes
    from fptrace.errors import BadInput, param

    if values["graph_transcoders"] is not None and not values["graph"]:
        raise BadInput(f"{param('graph_transcoders')} goes with {param('graph')}")
    if values["graph"]:
        check_nodes(values["graph_transcoders"] is None, values["graph_transcoders"])


def _compute(page: Page, values: dict[str, Any]) -> AttributionGraph | None:
    from fptrace.commands.graph.core import graph

    if not values["graph"]:
        return None
    return graph(page.lm, page.prompt, transcoders=values["graph_transcoders"])


VERIFIED = "Verified by intervention (--verify)"


def _body(result: AttributionGraph) -> list[str]:
    from fptrace.commands.graph.render import graph_view, verify_table

    parts = section("How the answer was computed: the attribution graph", "", None,
                    graph_view(result, 130, verified=False))
    if result.verified:
        parts += section(VERIFIED, "", None, verify_table(result, 130))
    return parts


VERIFY_COLUMNS = ("its edge's prediction (−edge)", "frozen, every path", "real, nothing frozen",
                  "held: every computed node off by")


def verified(g: AttributionGraph) -> SectionData:
    """--verify's own section: a row per removed node; the top logit's change its edge into
    the logit predicts (minus the edge: what the frozen intervention with every other node
    held changes it by, checked for every computed node, `graph_verify`), the frozen change
    through every path (the graph's prediction) and the real change (nothing frozen) beside
    it, and how far the held intervention's change of any computed node was from minus its
    edge (relative)."""
    from fptrace.render.pagedata import Heatmap, SectionData
    from fptrace.render.text import visible

    logit = visible(g.verify_logit or "")
    values = tuple((v.direct, v.predicted, v.real, v.difference) for v in g.verified)
    tips = tuple(tuple(
        f"{v.node}: into {v.targets} computed nodes (largest |edge| {v.largest_edge:.4g}); "
        f"held, every computed node moved by minus its edge (off by {v.difference:.1e}); "
        f"logit {logit!r}: −edge {v.direct:+.6g}, frozen {v.predicted:+.6g}, real "
        f"{v.real:+.6g}" for _ in VERIFY_COLUMNS) for v in g.verified)
    return SectionData(VERIFIED, heatmaps=(Heatmap(
        f"each node removed (set to 0), one at a time: the change of the logit {logit!r} its "
        "edge predicts (minus the edge; the frozen intervention with every other node held "
        "changes every computed node by minus its edge, off by the last column, relative), the "
        "change through every path of the frozen model (the graph's prediction) and the real "
        "change (nothing frozen): a number beside the prediction, not a verdict",
        f"Δ logit {logit!r}", tuple(v.node for v in g.verified), VERIFY_COLUMNS, values,
        diverging=True, labels=tuple((f"{a:+.4f}", f"{b:+.4f}", f"{c:+.4f}", f"{d:.1e}")
                                     for a, b, c, d in values), tips=tips),))


def _name(n: GraphNode, tokens: tuple[Token, ...]) -> str:
    if n.node_type == "embedding":
        return f"{tokens[n.position].text!r}@{n.position}"
    if n.node_type == "logit":
        return f"→{n.label}"
    return f"{n.label.replace(' @', '@')}"


def node_lines(g: AttributionGraph) -> dict[str, list[str]]:
    """node_id -> the lines its hover shows: what it is, its value and influence, its strongest
    kept edges in and out."""
    names = {n.node_id: _name(n, g.tokens) for n in g.nodes}
    into: dict[str, list[GraphEdge]] = defaultdict(list)
    out: dict[str, list[GraphEdge]] = defaultdict(list)
    for e in g.edges:
        into[e.target].append(e)
        out[e.source].append(e)
    lines: dict[str, list[str]] = {}
    for n in g.nodes:
        value = "" if n.value is None else f", activation {n.value:+.4g}"
        got = [f"{names[n.node_id]} ({n.node_type}{value}, influence {n.influence:.4f})"]
        for label, edges, end in (("in", into[n.node_id], "source"),
                                  ("out", out[n.node_id], "target")):
            strongest = sorted(edges, key=lambda e: -abs(e.weight))[:EDGES_SHOWN]
            if strongest:
                got.append(f"  {label}: " + ", ".join(
                    f"{names[getattr(e, end)]} {e.weight:+.4g}" for e in strongest))
        lines[n.node_id] = got
    return lines


KINDS = {"embedding": "token", "neuron": "node", "latent": "node", "other neurons": "remainder",
         "other latents": "remainder", "error": "error", "logit": "output"}


def drawing(g: AttributionGraph) -> NodeGraph:
    """The graph as a node-link drawing (render/pagedata.py's NodeGraph): the kept nodes at
    (block, position), tokens at the bottom and logits at the top, each sized by its
    influence; the kept edges, the EDGES_DRAWN strongest drawn until more are asked for; a
    neuron's (latent's) activation at every position and each node's effect on each logit."""
    from fptrace.render.pagedata import DrawnNode, LogitEffect, NodeGraph

    L = g.model.n_layers
    names = {n.node_id: _name(n, g.tokens) for n in g.nodes}
    lines = node_lines(g)
    what = "neuron" if g.transcoders is None else "latent"
    nodes = tuple(DrawnNode(
        id=n.node_id, label=names[n.node_id], kind=KINDS[n.node_type],
        row=0 if n.node_type == "embedding" else L + 1 if n.layer is None else n.layer + 1,
        position=n.position, size=n.influence, info=lines[n.node_id][0],
        activations=n.activations or (),
        effects=tuple(LogitEffect(node=e.logit, edge=e.edge, influence=e.influence)
                      for e in n.logits)) for n in g.nodes)
    edges = tuple((e.source, e.target, e.weight)
                  for e in sorted(g.edges, key=lambda e: -abs(e.weight)))
    return NodeGraph(
        "the pruned graph as nodes and edges: x the position, y the block (tokens at the "
        "bottom, logits at the top), a circle's area its influence on the logits; hover a node "
        "for its edges, click it for its activation at every position and its effect on the "
        "logits", ("tokens", *(f"block {b}" for b in range(L)), "logits"),
        tuple(f"{t.text!r}" for t in g.tokens), nodes, edges, min(len(edges), EDGES_DRAWN),
        kinds=(("token", "token"), ("node", what),
               ("remainder", f"other {what}s (a site's remainder)"),
               *((("error", "error node"),) if g.transcoders is not None else ()),
               ("output", "logit")))


def _data(result: AttributionGraph) -> SectionData | tuple[SectionData, SectionData]:
    from fptrace.render.pagedata import Heatmap, SectionData

    g = result
    L, T = g.model.n_layers, len(g.tokens)
    influence = [[0.0] * T for _ in range(L)]
    count = [[0] * T for _ in range(L)]
    tips: list[list[list[str]]] = [[[] for _ in range(T)] for _ in range(L)]
    lines = node_lines(g)
    for n in g.nodes:
        if n.layer is None:
            continue
        influence[n.layer][n.position] += n.influence
        count[n.layer][n.position] += n.node_type in ("neuron", "latent")
        tips[n.layer][n.position] += lines[n.node_id]
    what = "neurons" if g.transcoders is None else "latents"
    data = SectionData("Attribution graph", heatmaps=(Heatmap(
        f"the pruned graph by block and position: a cell's colour the influence on the logits "
        f"of its nodes, its label how many {what} are kept there; hover for each node's value, "
        "influence and strongest edges", "influence",
        tuple(f"block {b}" for b in range(L)),
        tuple(f"{k} {t.text!r}" for k, t in enumerate(g.tokens)),
        tuple(tuple(influence[b][p] if tips[b][p] else None for p in range(T))
              for b in range(L)), blocks=tuple(range(L)),
        labels=tuple(tuple(str(count[b][p]) if count[b][p] else "·" for p in range(T))
                     for b in range(L)),
        tips=tuple(tuple("\n".join(tips[b][p]) for p in range(T)) for b in range(L))),),
        graphs=(drawing(g),))
    return (data, verified(g)) if g.verified else data


def _verify(result: AttributionGraph) -> None:
    from fptrace.cli.io import check_match

    check_match(result.ok, [c.name for c in result.checks if not c.ok])


SECTION = ReportSection(order=48, compute=_compute, body=_body, options=OPTIONS, check=_check,
                        verify=_verify, data=_data)
