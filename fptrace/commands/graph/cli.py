"""`fptrace graph`: the Typer command."""

from __future__ import annotations

from typing import Annotated

import typer

from fptrace.cli.io import Group, load_for, output, prompt_command
from fptrace.cli.options import (
    OUTPUT,
    STATS,
    ChatOptions,
    GpusPerWorkerOpt,
    LoadOptions,
    Outputs,
    RayOpt,
    WorkersOpt,
)

GRAPH = "Graph"


@prompt_command(order=42, group=Group.why, docs="graph",
                examples=('fptrace graph "The capital of France is" --neurons --max-nodes 24 '
                          '--verify 3',),
                placement=False, plot=False)
def graph(
    prompt: Annotated[str | None, typer.Argument(
        help="The text whose next token is explained (or --messages FILE).")] = None,
    opts: LoadOptions = LoadOptions(),
    chat: ChatOptions = ChatOptions(),
    neurons: Annotated[bool, typer.Option(
        "--neurons", help="The nodes are the model's own MLP neurons, their gates frozen (no "
        "dictionary needed).", rich_help_panel=GRAPH)] = False,
    transcoders: Annotated[str | None, typer.Option(
        "--transcoders", metavar="DIR", help="The nodes are the latents of the per-block "
        "transcoders in DIR (each block's MLP replaced by its transcoder, one error node per "
        "block and position), as `features train --transcoder` writes them.",
        rich_help_panel=GRAPH)] = None,
    target: Annotated[str | None, typer.Option(
        "--target", help="One logit node: this token (' Paris' or #ID); default: the top "
        "logits holding 0.95 of the probability, at most 10.", rich_help_panel=GRAPH)] = None,
    positions: Annotated[str | None, typer.Option(
        "--positions", metavar="POSITIONS", help="The query positions whose logits are the "
        "outputs (3, -1, 0-3,7, all); default: the last.", rich_help_panel=GRAPH)] = None,
    node_threshold: Annotated[str, typer.Option(
        "--node-threshold", metavar="X", help="Keep the nodes holding this share of the "
        "influence on the logits (0 to 1).", rich_help_panel=GRAPH)] = "0.8",
    edge_threshold: Annotated[str, typer.Option(
        "--edge-threshold", metavar="Y", help="Keep the edges holding this share of the edge "
        "scores (0 to 1; 1 keeps every edge).", rich_help_panel=GRAPH)] = "0.98",
    max_nodes: Annotated[str, typer.Option(
        "--max-nodes", metavar="N", help="At most N neurons get their incoming edges computed, "
        "the most influential first.", rich_help_panel=GRAPH)] = "64",
    per_site: Annotated[str, typer.Option(
        "--per-site", metavar="K", help="Candidate neurons per layer and position: the K of "
        "largest |activation|.", rich_help_panel=STATS)] = "4",
    verify: Annotated[str, typer.Option(
        "--verify", metavar="N", help="Remove the N most influential nodes one at a time: each "
        "must change every computed node by minus its edge (checked: exit 5), and the top "
        "logit's real change is shown beside the graph's prediction.",
        rich_help_panel=GRAPH)] = "0",
    qk: Annotated[str, typer.Option(
        "--qk", metavar="N", help="For the N largest head shares of the kept edges, why the head "
        "attends there: its attention score at (the query that reads most of it, the source's "
        "position) split into query-part × key-part terms, as attribute --qk splits it.",
        rich_help_panel=GRAPH)] = "0",
    precision: Annotated[str, typer.Option(
        "--precision", metavar="DTYPE", help="The dtype of the rows' backward passes: float64, "
        "or float32 (faster on CPU; each row still checked against its float64 value, and "
        "recomputed in float64 where it misses; not with --verify or --qk).",
        rich_help_panel=STATS)] = "float64",
    graph_json: Annotated[str | None, typer.Option(
        "--graph-json", metavar="FILE", help="Also write the graph in circuit-tracer's "
        "frontend format (.json).", rich_help_panel=OUTPUT)] = None,
    ray: RayOpt = None,
    workers: WorkersOpt = 1,
    gpus_per_worker: GpusPerWorkerOpt = None,
    outputs: Outputs = Outputs(),
) -> None:
    """How the answer was computed, node by node, exactly.

    An attribution graph whose nodes are the model's own MLP neurons (--neurons) or the latents
    of per-block transcoders with their error nodes (--transcoders DIR), tokens and logits: with
    attention patterns, norm scales and neuron gates (latent activations) frozen at their values
    the model is linear, every edge is a direct effect, and every node's edges plus its bias
    terms equal its value (checked on every run: exit 5 when they do not). Pruned by
    circuit-tracer's definitions; --graph-json writes a file its viewer opens. With --ray, the
    backward passes run on a Ray cluster's actors: the same graph, bit for bit."""
    from fptrace.addresses import parse_selection
    from fptrace.commands.graph.inputs import check_request

    req = check_request(neurons=neurons, node_threshold=node_threshold,
                        edge_threshold=edge_threshold, max_nodes=max_nodes, per_site=per_site,
                        positions=None if positions is None
                        else parse_selection(positions, "--positions"),
                        graph_json=graph_json, force=outputs.force,
                        transcoders=transcoders, verify=verify, qk=qk, workers=workers,
                        gpus_per_worker=gpus_per_worker, ray=ray, precision=precision)
    from fptrace.commands.graph.core import graph as run_graph
    from fptrace.commands.graph.ray import ray_rows

    # with --ray, the actors load the model while this process loads its own (None: here)
    with ray_rows(ray, workers, gpus_per_worker, opts) as pool:
        lm, prompt = load_for(prompt, opts, chat, outputs)
        result = run_graph(lm, prompt, positions=req.positions, target=target,
                           node_threshold=req.node_threshold, edge_threshold=req.edge_threshold,
                           max_nodes=req.max_nodes, per_site=req.per_site,
                           transcoders=req.transcoders, verify=req.verify, qk=req.qk,
                           pool=pool, precision=req.precision)
    from fptrace.commands.graph.render import graph_view

    output(result, graph_view, outputs)
    if not result.ok:  # exit 5, naming the node, before any file is written
        from fptrace.errors import Mismatch

        raise Mismatch("the graph is not exact: " + "; ".join(
            f"{c.name} {c.value:.2e} at {c.worst} ({c.tolerance})" for c in result.checks
            if not c.ok))
    if outputs.html is not None:
        from fptrace.cli.page import write_page

        write_page(outputs.html, lm, prompt, "graph", result)
    if graph_json is not None:
        from fptrace.cli.io import stderr_console
        from fptrace.commands.graph.frontend import write_graph_file

        write_graph_file(result, graph_json)
        stderr_console().print(f"[dim]wrote {graph_json}[/dim]", soft_wrap=True)
