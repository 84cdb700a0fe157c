"""The terminal view of `fptrace graph`: the freezing, the check, the logits, the strongest
paths from the tokens to the answer, the top nodes by influence."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from fptrace.commands.graph.result import AttributionGraph, GraphNode
from fptrace.render.fit import Col, fit_table
from fptrace.render.tables import header
from fptrace.render.text import bullets, visible

TOP_NODES = 12


def neuron_text(n: GraphNode) -> str:
    """`N417`, in a mixture of experts `E5 N417` or `shared N417`."""
    if n.shared_expert:
        return f"shared N{n.neuron}"
    return f"N{n.index}" if n.expert is None else f"E{n.expert} N{n.neuron}"


def _names(g: AttributionGraph) -> dict[str, str]:
    """node_id -> a short name: `'cat'@2`, `L3 N417@5` (`L3 E5 N17@5`), `L3 rest@5`,
    `→' Paris'`."""
    out = {}
    for n in g.nodes:
        if n.node_type == "embedding":
            out[n.node_id] = f"{visible(g.tokens[n.position].text)!r}@{n.position}"
        elif n.node_type == "neuron":
            out[n.node_id] = f"L{n.layer} {neuron_text(n)}@{n.position}"
        elif n.node_type == "latent":
            out[n.node_id] = f"L{n.layer} T{n.index}@{n.position}"
        elif n.node_type in ("other neurons", "other latents"):
            out[n.node_id] = f"L{n.layer} rest@{n.position}"
        elif n.node_type == "error":
            out[n.node_id] = f"L{n.layer} error@{n.position}"
        else:
            out[n.node_id] = f"→{visible(n.label.strip(chr(39)))!r}"
    return out


def freezing(g: AttributionGraph) -> RenderableType:
    """What is held, one bullet a line (wrapped lines indented under their bullet)."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for line in g.freezing:
        grid.add_row("  •", line)
    grid.add_row("", Text(f"{g.edge}; error nodes: {g.error_nodes}.", style="dim"))
    return Group(Text("Frozen at their values in this forward pass (the model is then "
                      "linear):", style="bold"), grid)


def summary(g: AttributionGraph) -> Text:
    queries = ", ".join(str(q) for q in g.queries)
    what = "neurons" if g.transcoders is None else "latents"
    kept_n = sum(1 for n in g.nodes if n.node_type in ("neuron", "latent"))
    text = Text(f"Graph of the next token at position {queries}: {g.computed} {what} "
                f"computed (of {g.candidates} candidates, the {g.per_site} largest |activation| "
                f"per layer and position; --max-nodes {g.max_nodes}); kept after pruning "
                f"(node {g.node_threshold:g}, edge {g.edge_threshold:g}): {len(g.nodes)} nodes "
                f"({kept_n} {what}), {len(g.edges)} edges.\n")
    s = g.scores
    if g.transcoders is None:
        text.append(f"replacement {s.replacement:.3f}  completeness {s.completeness:.3f} "
                    f"(1 by construction: no error nodes); with the remainders as error nodes: "
                    f"replacement {s.replacement_nodes:.3f}  completeness "
                    f"{s.completeness_nodes:.3f}")
    else:
        text.append(f"replacement {s.replacement:.3f}  completeness {s.completeness:.3f} "
                    f"(over the transcoders' error nodes); with the remainders counted as error "
                    f"too: replacement {s.replacement_nodes:.3f}  completeness "
                    f"{s.completeness_nodes:.3f}")
    return text


LOGIT_COLS = (Col("logit", 0), Col("p", 0, "right"), Col("value", 0, "right"),
              Col("bias terms", 2, "right"), Col("position", 1, "right"))


def logits_table(g: AttributionGraph, width: int | None) -> RenderableType:
    rows = [[visible(n.label), f"{n.prob:.3f}", f"{n.value:+.3f}", f"{n.bias:+.3f}",
             str(n.position)] for n in g.nodes if n.node_type == "logit"]
    return fit_table(LOGIT_COLS, rows, width, title="Logit nodes (edges in + bias terms = value)",
                     title_justify="left")


PATH_COLS = (Col("#", 0, "right"), Col("strength", 0, "right"), Col("path", 0, wrap=True))


def paths_table(g: AttributionGraph, width: int | None) -> RenderableType:
    names = _names(g)
    rows = []
    for k, p in enumerate(g.paths, 1):
        steps = [names.get(p.nodes[0], p.nodes[0])]
        for node, w in zip(p.nodes[1:], p.weights, strict=True):
            steps.append(f"({w:+.2f})→ {names.get(node, node)}")
        rows.append([str(k), f"{p.strength:.2e}", " ".join(steps)])
    return fit_table(PATH_COLS, rows, width, title="Strongest paths from a token to the answer "
                     "(strength: the path's share of the influence; edge weights in "
                     "brackets)", title_justify="left")


NODE_COLS = (Col("#", 0, "right"), Col("node", 0), Col("type", 1), Col("influence", 0, "right"),
             Col("cumulative", 2, "right"), Col("activation", 1, "right"),
             Col("bias terms", 3, "right"))


def _cell(x: float | None) -> str:
    return "" if x is None else f"{x:+.3f}"


def nodes_table(g: AttributionGraph, width: int | None) -> RenderableType:
    names = _names(g)
    top: list[GraphNode] = [n for n in g.nodes if n.node_type != "logit"][:TOP_NODES]
    rows = [[str(k), names[n.node_id], n.node_type, f"{n.influence:.3f}", f"{n.cumulative:.3f}",
             _cell(n.value), _cell(n.bias)] for k, n in enumerate(top, 1)]
    return fit_table(NODE_COLS, rows, width, title=f"The {len(top)} most influential nodes "
                     "(influence on the logits, circuit-tracer's definition)",
                     title_justify="left")


ROUTE_COLS = (Col("site", 0), Col("experts chosen: weight", 0, wrap=True),
              Col("shared gate", 1, "right"))


def routes_table(g: AttributionGraph, width: int | None) -> RenderableType | None:
    """A mixture of experts: the router's choice (held in the freezing) at the sites of the
    most influential nodes (the JSON has every kept site's)."""
    if not g.routes:
        return None
    top = [n for n in g.nodes if n.node_type in ("neuron", "other neurons")][:TOP_NODES]
    sites = {(n.layer, n.position) for n in top}
    rows = [[f"L{r.layer} @{r.position}",
             ", ".join(f"E{e}: {w:.3f}" for e, w in zip(r.experts, r.weights, strict=True)),
             "" if r.shared_gate is None else f"{r.shared_gate:.3f}"]
            for r in g.routes if (r.layer, r.position) in sites]
    return fit_table(ROUTE_COLS, rows, width, title="The router's choice, held (the sites of "
                     f"the {len(top)} most influential neurons and remainders; --json: every "
                     "kept site's)", title_justify="left")


TOP_EDGES = 8
HEAD_COLS = (Col("edge", 0, wrap=True), Col("weight", 0, "right"), Col("direct", 0, "right"),
             Col("heads (block.head: share)", 0, wrap=True), Col("other heads", 1, "right"))


def heads_table(g: AttributionGraph, width: int | None) -> RenderableType | None:
    """The kept edges that attention carries most (|weight − direct|), each with its heads."""
    names = _names(g)
    carried = sorted((e for e in g.edges if e.direct is not None and e.heads),
                     key=lambda e: -abs(e.weight - (e.direct or 0.0) - (e.skip or 0.0)))
    carried = carried[:TOP_EDGES]
    if not carried:
        return None
    skips = any(e.skip is not None for e in carried)  # skip transcoders: their part, a column
    rows = [[f"{names.get(e.source, e.source)} → {names.get(e.target, e.target)}",
             f"{e.weight:+.3f}", f"{e.direct:+.3f}",
             ", ".join(f"L{h.layer}.H{h.head}: {h.share:+.3f}" for h in e.heads),
             f"{e.heads_rest or 0.0:+.3f}", *([f"{e.skip or 0.0:+.3f}"] if skips else [])]
            for e in carried]
    cols = (*HEAD_COLS, Col("skip", 1, "right")) if skips else HEAD_COLS
    plus = (" + skip (the part whose first hop is a skip transcoder's x·W_skip)" if skips
            else "")
    return fit_table(cols, rows, width, title="Edges through attention heads (the kept "
                     "edges attention carries most: weight = direct + the heads' shares + "
                     f"other heads{plus}; a head's share: the part whose first hop is that head "
                     "reading the source's position)", title_justify="left")


QK_COLS = (Col("edge", 0, wrap=True), Col("head", 0), Col("query→key", 0),
           Col("share (at query)", 1, "right"), Col("weight", 1, "right"),
           Col("score", 0, "right"), Col("largest terms (query part × key part)", 0, wrap=True))


def part_text(component: str, layer: int | None, head: int | None) -> str:
    """A part of a stream, short: `embed`, `L3.H2`, `L3 mlp`, `L3 attn bias`, `bias`."""
    if component == "attn_head":
        return f"L{layer}.H{head}"
    if layer is None:
        return component.replace("_", " ")
    return f"L{layer} {component.replace('_', ' ')}"


def qk_table(g: AttributionGraph, width: int | None) -> RenderableType | None:
    """--qk: for the largest head shares, the head's attention score split."""
    if not g.qk:
        return None
    names = _names(g)
    rows = [[f"{names.get(x.source, x.source)} → {names.get(x.target, x.target)}",
             f"L{x.layer}.H{x.head}", f"{x.query}→{x.key}",
             f"{x.share:+.3f} ({x.query_share:+.3f})", f"{x.weight:.3f}", f"{x.score:+.3f}",
             ", ".join(f"{part_text(t.query.component, t.query.layer, t.query.head)} × "
                       f"{part_text(t.key.component, t.key.layer, t.key.head)}: {t.value:+.2f}"
                       for t in x.top[:3])] for x in g.qk]
    return fit_table(QK_COLS, rows, width, title="Why the heads attend there (--qk): the "
                     "largest head shares of the kept edges, the query that reads most of each "
                     "(its part in brackets), the head's weight and score there split into "
                     "terms (attribute --qk; --json: every term shown there)",
                     title_justify="left")


VERIFY_COLS = (Col("node", 0), Col("into", 2, "right"), Col("largest edge", 2, "right"),
               Col("held: off by", 0, "right"), Col("direct", 0, "right"),
               Col("frozen", 0, "right"), Col("real", 0, "right"))


def verify_table(g: AttributionGraph, width: int | None) -> RenderableType | None:
    """--verify: each removed node, its edges against the intervention, and the top logit's
    change (direct: minus its edge; frozen: through every path of the linear model; real:
    nothing frozen)."""
    if not g.verified:
        return None
    rows = [[v.node, str(v.targets), f"{v.largest_edge:.3f}", f"{v.difference:.1e}",
             f"{v.direct:+.4f}", f"{v.predicted:+.4f}", f"{v.real:+.4f}"] for v in g.verified]
    logit = visible(g.verify_logit or "")
    return fit_table(VERIFY_COLS, rows, width, title=f"Verified by removal (--verify): each "
                     "node set to 0, every other node held, moves every computed node by minus "
                     f"its edge (off by: relative); the change of the logit {logit!r}: direct "
                     "(minus the edge), frozen (every path, the graph's prediction), real "
                     "(nothing frozen)", title_justify="left")


def verdict(g: AttributionGraph) -> Text:
    if g.ok:
        by = {c.name: c for c in g.checks}
        c = by["graph_sums"]
        heads = "".join(f"; every kept edge's split over heads sums to the edge (largest relative "
                        f"difference {v.value:.1e})" for n, v in by.items() if n == "graph_heads")
        held = "".join(f"; each --qk head's share split by query sums to it and its score "
                       f"split holds (largest relative difference {v.value:.1e})"
                       for n, v in by.items() if n == "graph_qk")
        held += "".join(f"; each removed node moved every computed node by minus its edge "
                       f"(largest relative difference {v.value:.1e})" for n, v in by.items()
                       if n == "graph_verify")
        return Text(f"✓ exact: every computed node's edges plus its bias terms equal its value "
                    f"in the model (largest relative difference {c.value:.1e}, at {c.worst}); "
                    f"float64 logits match the model's ({by['graph_model'].value:.1e})"
                    f"{heads}{held}", style="bold green")
    bad = "; ".join(f"{c.name}: {c.value:.2e} at {c.worst} ({c.tolerance})" for c in g.checks
                    if not c.ok)
    return Text(f"✗ THE GRAPH IS NOT EXACT: {bad}. Do not trust the numbers above.",
                style="bold white on red")


def graph_view(g: AttributionGraph, width: int | None = 120,
               verified: bool = True) -> RenderableType:
    """The graph at `width` columns; verified=False: without --verify's table (the page shows
    it in a section of its own: report.py)."""
    table = verify_table(g, width) if verified else None
    routes = routes_table(g, width)
    heads = heads_table(g, width)
    qk = qk_table(g, width)
    return Group(header(g.model), freezing(g), summary(g), logits_table(g, width),
                 paths_table(g, width), nodes_table(g, width),
                 *(() if heads is None else (heads,)), *(() if qk is None else (qk,)),
                 *(() if routes is None else (routes,)),
                 *(() if table is None else (table,)), bullets(g.notes), verdict(g))


__all__ = ["graph_view", "neuron_text", "verify_table"]
