"""Frozen results of `attribute`, `diff` and `patch` (re-exported by results.py)."""

from __future__ import annotations

from fptrace.results import (
    SCHEMA_VERSION,
    Check,
    ModelInfo,
    QKPart,
    QKPartSum,
    QKTerm,
    Token,
    TopToken,
    result,
)

SCHEMA_SINCE = "1.5"  # Contribution.expert and the `expert`, `shared_experts` components

# the targets of the checks this command's results carry (Check.target; `fptrace schema` joins
# every command's, in the order of `fptrace --help`)
CHECK_TARGETS = ("for `attribute --qk`: `qk_stream` (the parts sum to the streams), `qk_score` "
                 "(the terms sum to the score from the streams) or `qk_weights` (the recomputed "
                 "weights equal the model's)")


@result
class Contribution:
    """One part of the last position's stream, in logits of the target (or of the difference target
    − versus)."""

    component: str
    """`embed`, `attn_head`, `attn_bias`, `attn` (a block whose heads could not be split), `mlp`,
    `expert` (one routed expert a mixture-of-experts block chose at the last position: its output
    × its routing weight), `shared_experts` (that block's shared experts, their gate included),
    `final_norm_bias` or `lm_head_bias`. A mixture-of-experts block shows as its experts, not as
    `mlp`, unless they do not add up to its output."""
    #                 final_norm_bias, lm_head_bias
    layer: int | None
    """The block, or null."""
    head: int | None
    """The attention head, or null."""
    value: float
    """Logits this part contributes: the part through the final norm frozen at its actual scale for
    this position, then the target's unembedding row."""
    share: float
    """value / the sum of |value| over every part."""
    expert: int | None = None
    """For `expert`: the routed expert (of block `layer`); else null."""


@result
class LayerAttribution:
    """What one block's attention (all heads and the W_O bias) and MLP contributed, in logits."""

    layer: int
    """The block."""
    attn: float
    """Every head of this block and its W_O bias, in logits."""
    mlp: float
    """This block's MLP (a mixture of experts: its chosen and shared experts), in logits."""


@result
class Attribution:
    """`fptrace attribute --json`: direct logit attribution of the target's logit (or of target −
    versus) at the last position, summing to the model's own logit."""

    prompt: str
    """The prompt as given."""
    model: ModelInfo
    """The model that was run."""
    tokens: tuple[Token, ...]
    """The prompt's tokens."""
    target: TopToken
    """The token whose logit is attributed (default: the model's top-1), with its rank, probability
    and logit."""
    versus: TopToken | None
    """With `--versus`: the token whose logit is subtracted; else null."""
    model_logit: float
    """The model's own logit of the target (minus versus), read from the LM head's output: before
    any final softcap."""
    capped_logit: float | None
    """For families with a final-logit softcap: the logit after it; else null."""
    total: float
    """The sum of every contribution."""
    difference: float
    """total − model_logit."""
    tolerance: str
    """The rule the difference must meet, in words."""
    ok: bool
    """Whether it does; `fptrace attribute` exits with 5 when not."""
    contributions: tuple[Contribution, ...]
    """Every part, in stream order: the embedding, then per block each attention head (and the W_O
    bias), the MLP, then the final norm's and the LM head's biases."""
    top: tuple[Contribution, ...]
    """The `--top` contributions of largest absolute value."""
    layers: tuple[LayerAttribution, ...]
    """Per block: attention and MLP."""
    head_grid: tuple[tuple[float, ...], ...]
    """Per block, each head's contribution (empty for a block whose heads could not be split
    exactly)."""
    notes: tuple[str, ...]
    """Sentences a reader should see with the numbers (random weights, truncation, ...)."""
    kind: str = "attribution"
    schema_version: str = SCHEMA_VERSION




@result
class QKAttribution:
    """`fptrace attribute --qk L.H --json`: one attention score of one head split exactly into
    query-part × key-part terms, and the weight the softmax made of it."""

    prompt: str
    """The prompt as given."""
    model: ModelInfo
    """The model that was run."""
    tokens: tuple[Token, ...]
    """The prompt's tokens."""
    layer: int
    """The block of the head."""
    head: int
    """The query head."""
    kv_head: int
    """The key/value head it reads (grouped-query attention shares one among several heads)."""
    query: int
    """The query position (default: the last)."""
    key: int
    """The key position (default: the position the query attends to most in this head)."""
    most_attended: int
    """The key position with the largest weight in the query's row."""
    scale: float
    """The factor q · k is multiplied by: 1/√head_dim, query_pre_attn_scalar^−½ (Gemma), or
    GPT-2's options (no scaling, ÷ (layer + 1))."""
    score: float
    """The sum of every term: the score before the softmax, the mask and any softcap."""
    stream_score: float
    """The same score computed from the whole streams the model had at the two positions (not
    from their parts)."""
    difference: float
    """score − stream_score."""
    softcap: float | None
    """The attention-logit softcap of this model, or null."""
    capped_score: float | None
    """With a softcap: softcap · tanh(score / softcap), what the softmax reads; else null."""
    window: int | None
    """The sliding window of this block (the query sees keys query − window + 1 .. query), or
    null."""
    weight: float
    """The model's own attention weight of the query on the key in this head (its eager
    attention, after the softmax)."""
    recomputed_weight: float
    """The weight recomputed from the streams through the same operations as the split."""
    n_terms: int
    """How many terms the score has: query parts × key parts."""
    top: tuple[QKTerm, ...]
    """The `--top` terms of largest absolute value."""
    rest: float
    """The sum of every other term: score = Σ top + rest."""
    query_parts: tuple[QKPartSum, ...]
    """Every part of the query's stream, in stream order, each summed over the key's parts."""
    key_parts: tuple[QKPartSum, ...]
    """Every part of the key's stream, in stream order, each summed over the query's parts."""
    grid_rows: tuple[QKPart, ...]
    """The rows of `grid`: the query parts of largest |value|, then `rest` (the others)."""
    grid_columns: tuple[QKPart, ...]
    """The columns of `grid`: the key parts of largest |value|, then `rest`."""
    grid: tuple[tuple[float, ...], ...]
    """Terms summed into rows × columns (what --plot draws); the cells sum to the score."""
    checks: tuple[Check, ...]
    """What the command checked against the model on this run: the parts sum to the streams,
    the terms to the score computed from the streams, the recomputed weights equal the
    model's."""
    ok: bool
    """Whether every check holds; `fptrace attribute --qk` exits with 5 when not."""
    group: str
    """What the terminal view lists: `term` (query part × key part) or `source` (each side's
    parts summed over the other side)."""
    notes: tuple[str, ...]
    """Sentences a reader should see with the numbers."""
    kind: str = "qk_attribution"
    schema_version: str = SCHEMA_VERSION
