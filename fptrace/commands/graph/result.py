"""The result of `fptrace graph` (`--neurons`, `--transcoders DIR`)."""

from __future__ import annotations

from fptrace.results import SCHEMA_VERSION, Check, ModelInfo, QKTerm, Token, result

# 1.6: `fptrace graph` (this kind); 1.7: graphs over transcoders (AttributionGraph.transcoders,
# .missing_blocks; the latent, other latents and error nodes); 1.8: --verify
# (AttributionGraph.verified, GraphVerified, the graph_verify check); 1.9: the page's drawing
# (GraphNode.activations, GraphNode.logits, GraphLogitEffect) and mixtures of experts
# (GraphNode.expert, .shared_expert, .neuron; AttributionGraph.routes, GraphRoute); 1.10: heads
# on edges (GraphEdge.direct, .heads, .heads_rest; EdgeHead; the graph_heads check) and --qk
# (AttributionGraph.qk, GraphQK; the graph_qk check)
# 1.11: GraphEdge.skip (skip transcoders)
# 1.12: GraphVerified.held (the held intervention's measured logit change) and
# AttributionGraph.precision (--precision float32)
SCHEMA_SINCE = "1.12"

CHECK_TARGETS = ("for `graph`: `graph_sums` (every computed node's incoming edges plus its bias "
                 "terms equal its value in the model, float64), `graph_model` (the float64 "
                 "copy's logits equal the model's own), `graph_heads` (every kept edge's "
                 "split over attention heads sums to the edge), with --qk `graph_qk` (each "
                 "head's share split by query sums to it, and each score split holds) and, "
                 "with --verify, `graph_verify` (each removed node changes every computed node "
                 "by minus its edge)")


@result
class GraphLogitEffect:
    """What one node does to one logit node of the graph."""

    logit: str
    """The logit node's node_id."""
    edge: float
    """The node's direct edge into that logit (0 where it has none), from the unpruned graph:
    the pruning may drop it from `edges`."""
    influence: float
    """The node's influence on that logit alone (circuit-tracer's node influence with that
    logit's weight 1 and every other logit's 0): the node's `influence` is the sum of these
    weighted by each logit's probability."""


@result
class GraphNode:
    """One node of the attribution graph."""

    node_id: str
    """The node's id, unique in the graph: `E_{token}_{position}` (a token),
    `{layer}_{neuron}_{position}` (a neuron or latent, as circuit-tracer's frontend spells a
    feature), `R_{layer}_{position}` (the neurons or latents of a site left out of the graph),
    `X_{layer}_{position}` (with transcoders: the site's error node; circuit-tracer spells it
    `0_{layer}_{position}`, which names a block-0 feature too), `{n_layers + 1}_{token}_{position}`
    (a logit)."""
    node_type: str
    """`embedding` (a token at a position), `neuron` (one MLP neuron at a position), `latent`
    (one transcoder latent at a position), `other neurons` / `other latents` (every neuron or
    latent of one (layer, position) that is not a node of the graph, summed: an exact
    remainder, not an error), `error` (what a block's transcoder misses of its MLP's output at
    one position) or `logit`."""
    layer: int | None
    """The block of a neuron, latent, remainder or error node; null for tokens and logits."""
    position: int
    """The position in the prompt."""
    index: int | None
    """A neuron's index in its MLP (a latent's in its transcoder), or the token id of a token or
    logit; null for a remainder or an error node. In a mixture-of-experts block the MLP's
    neurons are numbered expert by expert: routed expert e's neuron n is e · d_expert + n, the
    shared experts' neuron n is n_experts · d_expert + n."""
    label: str
    """What the node is, in words (`L3 N417 @5`; in a mixture of experts `L3 E5 N17 @5`, `L3
    shared N17 @5`; `' Paris'`)."""
    value: float | None
    """A neuron's (latent's) activation or a logit's value in the model (float64); null for
    tokens, remainders and error nodes (a vector, not a number)."""
    influence: float
    """The node's influence on the logits (circuit-tracer's node influence: the sum over its
    paths to the logits of the products of each edge's share of its target's input, weighted by
    each logit's probability)."""
    cumulative: float
    """The share of the total influence held by the nodes at least as influential as this one
    (what circuit-tracer's graph file calls `influence`)."""
    bias: float | None
    """For a computed node (neuron, logit): its bias terms, the part of its value no source
    carries (biases of linear maps and norms, a learned position embedding); else null."""
    prob: float | None = None
    """For a logit: the token's probability at that position; else null."""
    activations: tuple[float, ...] | None = None
    """For a neuron (latent): its activation at every position of the prompt, from the same
    float64 forward pass as `value` (the same neuron of the same block; `value` is the one at
    `position`); else null."""
    logits: tuple[GraphLogitEffect, ...] = ()
    """For every node but a logit: its direct edge into and its influence on each logit node,
    in the order of the logit nodes in `nodes`; empty for a logit."""
    expert: int | None = None
    """For a neuron of a mixture-of-experts block: the routed expert it belongs to (one the
    router chose at its position); null for a shared expert's neuron, a dense MLP's and every
    other node."""
    shared_expert: bool = False
    """For a neuron of a mixture-of-experts block: whether it is one of the shared experts'
    (Qwen2-MoE's shared expert, DeepSeek-V3's shared experts), which every position takes."""
    neuron: int | None = None
    """For a neuron of a mixture-of-experts block: its index within its expert (or within the
    shared experts' MLP); null otherwise (a dense neuron's index is `index`)."""


@result
class EdgeHead:
    """One attention head's part of an edge: the part whose first attention hop is this head
    reading the source's position (through its values; its pattern is frozen)."""

    layer: int
    """The head's block."""
    head: int
    """The query head (grouped-query attention: each query head of a shared K/V head apart)."""
    share: float
    """Its part of the edge's weight, in the same units: ⟨the gradient of the target with
    respect to this head's values at the source's position, what the source's vector adds to
    them⟩ (through the frozen norm and W_V)."""


@result
class GraphEdge:
    """One edge: the direct effect of a source on a target under the freezing."""

    source: str
    """The source's node_id."""
    target: str
    """The target's node_id."""
    weight: float
    """The source's value × the gradient of the target (a neuron's activation, or a logit) with
    respect to it, in the model with attention patterns, norm scales and neuron gates frozen,
    through no other neuron."""
    direct: float | None = None
    """The part of the weight that passes through no attention head: the target reading the
    source's vector in the stream at the source's own position (0 when the two positions
    differ). direct + Σ heads' shares + heads_rest (+ skip) = weight (checked: graph_heads)."""
    heads: tuple[EdgeHead, ...] = ()
    """The heads whose first hop carries the largest parts (at most 4, by |share|)."""
    heads_rest: float | None = None
    """The parts of every other head, summed."""
    skip: float | None = None
    """With skip transcoders: the part whose first hop is a later block's skip term x·W_skip
    reading the source's vector at its own position (summed over the blocks); null without
    a skip transcoder."""


@result
class GraphQK:
    """`--qk N`: one of the N largest head shares of the kept edges (those read mostly at
    query 0, which sees only itself, skipped), and why that head attends there: its attention
    score at (query, key) split into query-part × key-part terms (what `fptrace attribute --qk
    LAYER.HEAD --query Q --key K` computes, on the model as loaded)."""

    source: str
    """The edge's source (node_id)."""
    target: str
    """The edge's target (node_id)."""
    layer: int
    """The head's block."""
    head: int
    """The query head."""
    share: float
    """The head's share of the edge (EdgeHead.share)."""
    query: int
    """The query position whose read carries the largest part of the share: the head reads the
    source's position from every query position after it, and the share is the sum over them."""
    key: int
    """The key position: the source's."""
    query_share: float
    """The part of the share read at `query`: the frozen pattern's weight there times the
    gradient of the target at the head's output at `query`, dotted with what the source adds to
    the head's values."""
    pattern: float
    """The frozen pattern's weight of query on key in this head (the float64 pass's)."""
    weight: float
    """The model's own weight of query on key in this head (its eager attention, its dtype)."""
    score: float
    """The score (before the softmax, the mask and any softcap): the sum of every term."""
    top: tuple[QKTerm, ...]
    """The terms of largest |value|."""
    rest: float
    """The sum of every other term: score = Σ top + rest."""
    checks: tuple[Check, ...]
    """The score split's checks against the model (attribute --qk's: qk_stream, qk_score,
    qk_weights)."""


@result
class GraphPath:
    """A path from a token to a logit through the pruned graph."""

    nodes: tuple[str, ...]
    """node_ids from the token to the logit."""
    strength: float
    """The product of each edge's share of its target's input (|edge| / Σ|edges into the
    target|), times the logit's probability: this path's term of the token's influence."""
    weights: tuple[float, ...]
    """Each edge's weight along the path."""


@result
class GraphCheck:
    """The check that the graph is exact."""

    name: str
    """`graph_sums`, `graph_model`, `graph_heads`, (--qk) `graph_qk` or (--verify)
    `graph_verify`."""
    value: float
    """The largest relative difference measured."""
    tolerance: str
    """The rule it must meet, in words."""
    ok: bool
    """Whether it holds."""
    worst: str
    """The node (or logit) where the difference is largest."""


@result
class GraphVerified:
    """One node removed (`--verify N`: the N most influential neurons or latents, one at a
    time): its edges against the intervention they predict, and the top logit's change."""

    node: str
    """The removed node (its label)."""
    targets: int
    """Computed nodes (neurons or latents, logits) it has an edge into."""
    largest_edge: float
    """The largest |edge| from it into a computed node."""
    difference: float
    """With every other node held (attention patterns, norm scales, gates and the other nodes'
    activations at their values): the largest |change of a computed node + its edge from the
    removed one| relative to max(|edge|, 1e-6·Σ|terms|): 0 up to rounding when the edges are the
    direct effects they claim to be."""
    direct: float
    """The top logit's change its edge predicts (minus the edge): its direct effect."""
    held: float
    """The top logit's change measured with every other node held (the intervention of
    `difference`): equal to `direct` within the graph_verify tolerance, 0 when the node has no
    edge into that logit."""
    predicted: float
    """The top logit's change in the frozen model with the other nodes following it linearly:
    what the graph predicts over every path."""
    real: float
    """The top logit's real change: the node's activation set to 0 in the model as it computes
    (nothing frozen). Beside `predicted`, a number, not a verdict."""


@result
class GraphRoute:
    """A mixture-of-experts block's router at one position: the experts it chose and their
    weights, held at these values in the graph's freezing."""

    layer: int
    """The block."""
    position: int
    """The position in the prompt."""
    experts: tuple[int, ...]
    """The routed experts chosen there, by weight (largest first)."""
    weights: tuple[float, ...]
    """Each chosen expert's weight: what the block multiplies its output by (the router's own
    output, after any renormalisation and scaling)."""
    shared_gate: float | None = None
    """The shared expert's gate σ(shared_expert_gate · x) there (Qwen2-MoE); null where the
    family's shared experts have no gate or there are none."""


@result
class GraphScores:
    """circuit-tracer's two scores of a graph (its compute_graph_scores), and the same with the
    remainders in the role of error nodes."""

    replacement: float
    """The replacement score over the error nodes: with --neurons 1, since the freezing is exact
    and there is no error node; with transcoders the share of the tokens' influence among the
    tokens and the error nodes."""
    completeness: float
    """The completeness score over the error nodes: with --neurons 1 by construction; with
    transcoders the influence-weighted share of the nodes' inputs not from error nodes."""
    replacement_nodes: float
    """The replacement score with each site's remainder (the neurons or latents that are not
    nodes) counted as error too: how much of the tokens' influence reaches the logits through
    the graph's own nodes."""
    completeness_nodes: float
    """The completeness score with the remainders counted as error too: the influence-weighted
    share of the nodes' inputs that comes from the graph's nodes and tokens."""


@result
class AttributionGraph:
    """`fptrace graph --json`: an attribution graph whose nodes are the model's own MLP neurons
    (`--neurons`) or transcoder latents with error nodes (`--transcoders DIR`), exact under its
    freezing, pruned by circuit-tracer's definitions."""

    prompt: str
    """The prompt as given."""
    model: ModelInfo
    """The model that was run."""
    tokens: tuple[Token, ...]
    """The prompt's tokens (up to the last query position)."""
    queries: tuple[int, ...]
    """The query positions: those whose logits are the graph's outputs."""
    freezing: tuple[str, ...]
    """What is held at its value in the real forward pass, so that the model is linear."""
    edge: str
    """What an edge is, in words."""
    error_nodes: str
    """What the graph's error nodes are (with transcoders), or why it has none (--neurons)."""
    node_threshold: float
    """Nodes kept until they hold this share of the influence (--node-threshold)."""
    edge_threshold: float
    """Edges kept until they hold this share of the edge scores (--edge-threshold)."""
    max_nodes: int
    """At most this many neurons (latents) have their incoming edges computed (--max-nodes)."""
    per_site: int
    """At each (layer, position), the candidate neurons (latents): the per_site of largest
    |activation|, those whose activation is not 0."""
    candidates: int
    """Candidate neurons or latents (at most per_site × layers × positions)."""
    computed: int
    """Neurons (latents) whose incoming edges were computed (and checked), chosen by
    influence."""
    scores: GraphScores
    """Replacement and completeness scores of the unpruned graph."""
    nodes: tuple[GraphNode, ...]
    """The nodes the pruning keeps, by influence (tokens and logits always)."""
    edges: tuple[GraphEdge, ...]
    """The edges the pruning keeps."""
    paths: tuple[GraphPath, ...]
    """The strongest paths from a token to a logit through the kept graph."""
    checks: tuple[GraphCheck, ...]
    """The checks that the graph is exact (exit 5 when one fails)."""
    ok: bool
    """Whether every check holds."""
    notes: tuple[str, ...]
    """What to know about these numbers."""
    seconds: float
    """Time the graph took (the model's loading excluded)."""
    transcoders: str | None = None
    """The transcoders' folder (--transcoders), or null for --neurons."""
    missing_blocks: tuple[int, ...] = ()
    """With transcoders: the blocks that have none (their MLP output is all error)."""
    verified: tuple[GraphVerified, ...] = ()
    """With --verify N: the N most influential computed neurons or latents (those the pruning
    dropped included), each removed (empty without it)."""
    verify_logit: str | None = None
    """With --verify: the logit whose change is measured (the most probable logit node)."""
    routes: tuple[GraphRoute, ...] = ()
    """A mixture of experts: the router's choice at each (MoE block, position) where the graph
    keeps a neuron or a remainder, by block and position (empty for a dense model)."""
    qk: tuple[GraphQK, ...] = ()
    """With --qk N: the N largest head shares of the kept edges, each with its attention score
    split (empty without it)."""
    precision: str = "float64"
    """The dtype of the rows' backward passes (--precision): float64, or float32, each row then
    checked against its float64 value as graph_sums checks it and recomputed in float64 where
    it misses (the notes say how many; the split over heads likewise, graph_heads)."""
    kind: str = "graph"
    schema_version: str = SCHEMA_VERSION
