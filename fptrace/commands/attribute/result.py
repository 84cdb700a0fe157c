"""Frozen results of `attribute`, `diff` and `patch` (re-exported by results.py)."""

from __future__ import annotations

from fptrace.core.results import SCHEMA_VERSION, ModelInfo, Token, TopToken, result


@result
class Contribution:
    """One part of the last position's stream, in logits of the target (or of the difference target
    − versus)."""

    component: str
    """`embed`, `attn_head`, `attn_bias`, `attn` (a block whose heads could not be split), `mlp`,
    `final_norm_bias` or `lm_head_bias`."""
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


@result
class LayerAttribution:
    """What one block's attention (all heads and the W_O bias) and MLP contributed, in logits."""

    layer: int
    """The block."""
    attn: float
    """Every head of this block and its W_O bias, in logits."""
    mlp: float
    """This block's MLP, in logits."""


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


