"""The graph as circuit-tracer's frontend reads it (`--graph-json FILE`).

The layout of its circuit_tracer/frontend/graph_models.py (Model: metadata, qParams, nodes,
links) as its utils/create_graph_files.py fills it: a node has node_id, feature, layer (a
string: the block, `E` for a token, n_layers + 1 for a logit), ctx_idx (the position),
feature_type (`embedding`, `cross layer transcoder` (a transcoder latent, or here a neuron;
its feature: its index in its MLP, in a mixture of experts expert · d_expert + its neuron),
`mlp reconstruction error` (a transcoder's error node, or here a site's remainder, exact),
`logit`), jsNodeId, clerp, influence (the cumulative
influence) and activation; a link has source, target, weight (the edge, source → target).
`kind` and `schema_version` at the top mark the file as fptrace's (its viewer ignores them).
"""

from __future__ import annotations

import json
from typing import Any

from fptrace.commands.graph.render import neuron_text
from fptrace.commands.graph.result import AttributionGraph, GraphNode
from fptrace.results import SCHEMA_VERSION

FEATURE_TYPES = {"embedding": "embedding", "neuron": "cross layer transcoder",
                 "latent": "cross layer transcoder", "other neurons": "mlp reconstruction error",
                 "other latents": "mlp reconstruction error", "error": "mlp reconstruction error",
                 "logit": "logit"}


def _node(g: AttributionGraph, n: GraphNode) -> dict[str, Any]:
    L = g.model.n_layers
    layer = "E" if n.node_type == "embedding" else \
        str(L + 1) if n.node_type == "logit" else str(n.layer)
    feature: int | None
    if n.node_type == "embedding":
        feature, js = n.position, f"E_{n.index}-{n.position}"
    elif n.node_type in ("neuron", "latent"):
        feature, js = n.index, f"{n.layer}_{n.index}-0"
    elif n.node_type in ("other neurons", "other latents", "error"):
        feature, js = -1, f"{n.node_id}-0"
    else:
        feature, js = n.index, f"L_{n.index}-{n.position}"
    what = f"neuron {n.index}" if n.neuron is None else f"expert neuron {neuron_text(n)}"
    clerp = {"neuron": f"{what} of block {n.layer} (activation {n.value:+.4g})"
             if n.value is not None else "",
             "latent": f"transcoder latent {n.index} of block {n.layer} (activation "
                       f"{n.value:+.4g})" if n.value is not None else "",
             "other neurons": f"the other neurons of block {n.layer} at position {n.position} "
                              "(exact remainder, not an error)",
             "other latents": f"the other latents of block {n.layer} at position {n.position} "
                              "(exact remainder, not an error)",
             "error": f"what block {n.layer}'s transcoder misses at position {n.position}",
             "logit": f'Output "{n.label.strip(chr(39))}" (p={n.prob or 0:.3f})',
             "embedding": ""}[n.node_type]
    return {"node_id": n.node_id, "feature": feature, "layer": layer, "ctx_idx": n.position,
            "feature_type": FEATURE_TYPES[n.node_type], "token_prob": n.prob or 0.0,
            "is_target_logit": n.node_type == "logit" and n is _first_logit(g),
            "run_idx": 0, "reverse_ctx_idx": 0, "jsNodeId": js, "clerp": clerp,
            "influence": n.cumulative, "activation": n.value}


def _first_logit(g: AttributionGraph) -> GraphNode | None:
    logits = [n for n in g.nodes if n.node_type == "logit"]
    return max(logits, key=lambda n: n.prob or 0.0) if logits else None


def graph_file(g: AttributionGraph, slug: str = "fptrace-graph") -> dict[str, Any]:
    """The graph as circuit-tracer's frontend Model (a JSON-ready dict)."""
    return {
        "kind": "graph-file", "schema_version": SCHEMA_VERSION,
        "metadata": {"slug": slug,
                     "scan": f"fptrace-{'neurons' if g.transcoders is None else 'transcoders'}-"
                             f"{g.model.name}",
                     "transcoder_list": [] if g.transcoders is None else [g.transcoders],
                     "prompt_tokens": [t.text for t in g.tokens],
                     "prompt": g.prompt, "node_threshold": g.node_threshold,
                     "info": {"generator": "fptrace graph " + ("--neurons" if g.transcoders is None
                                                               else "--transcoders"),
                              "freezing": list(g.freezing),
                              "edge": g.edge, "error_nodes": g.error_nodes,
                              "scores": {"replacement": g.scores.replacement,
                                         "completeness": g.scores.completeness}}},
        "qParams": {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "",
                    "sg_pos": ""},
        "nodes": [_node(g, n) for n in g.nodes],
        "links": [{"source": e.source, "target": e.target, "weight": e.weight}
                  for e in g.edges],
    }


def write_graph_file(g: AttributionGraph, path: str) -> None:
    """Write graph_file(g) to path atomically (checked beforehand with check_target)."""
    from fptrace.atomic import write_text_atomic

    write_text_atomic(path, json.dumps(graph_file(g), ensure_ascii=False) + "\n", ".json")


__all__ = ["FEATURE_TYPES", "graph_file", "write_graph_file"]
