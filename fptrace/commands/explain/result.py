"""The result of `fptrace explain`."""

from __future__ import annotations

from fptrace.results import SCHEMA_VERSION, Check, ExplainStep, ModelInfo, Token, TopToken, result

# the targets of the checks this command's results carry (Check.target; `fptrace schema` joins
# every command's, in the order of `fptrace --help`)
CHECK_TARGETS = ("`embedding`, `softmax_rows`, `causal_zeros`, `attn_out`, `mlp_out`, `block` "
                 "(the recomputed block output), `per_position` or `logits` (explain), and on "
                 "an MoE block `router_logits`, `router_choice` and `router_weights` (the "
                 "recomputed router against the block's own)")


@result
class AttentionMatrix:
    """One head's (T, T) matrix; rows are query positions, columns key positions."""

    name: str
    """`scores + mask` (−∞ above the diagonal, written as null) or `weights`."""
    head: int
    """The query head."""
    labels: tuple[str, ...]
    """The token text of each position."""
    rows: tuple[tuple[float, ...], ...]
    """The matrix, row by row."""


@result
class SamplingRow:
    """One candidate token in the sampling table."""

    id: int
    """Token id."""
    text: str
    """The token's text."""
    logit: float
    """The model's logit."""
    probs: tuple[float, ...]
    """Its probability under each strategy."""


@result
class Sampling:
    """The next-token choice under four strategies, side by side."""

    temperature: float
    """`--temperature` (0 is greedy)."""
    top_k: int
    """`--top-k`."""
    top_p: float
    """`--top-p`."""
    seed: int
    """`--seed` of the draws."""
    strategies: tuple[str, ...]
    """The strategies, in the order of `kept`, `picks` and each row's `probs`."""
    kept: tuple[int, ...]
    """Tokens with non-zero probability under each strategy."""
    picks: tuple[TopToken, ...]
    """The token each strategy chose."""
    rows: tuple[SamplingRow, ...]
    """The most probable tokens, and any picked token beyond them."""


@result
class EmbeddingRow:
    """The embedding lookup of one token: the first values of each part and of the sum."""

    position: int
    """The token's position."""
    id: int
    """Its id: the row of the embedding matrix it selects."""
    text: str
    """Its text."""
    token_row: tuple[float, ...]
    """The first values of that row."""
    position_row: tuple[float, ...] | None
    """GPT-2: the first values of row `position` of the position matrix; null for families without
    one."""
    scale: float | None
    """Gemma: the √d the embedding is multiplied by; else null."""
    stream: tuple[float, ...]
    """The first values of the sum: what enters block 0."""


@result
class Explanation:
    """`fptrace explain --json`: one block recomputed step by step, checked against the model, then the
    end of the pass and the sampling choices."""

    prompt: str
    """The prompt as given."""
    model: ModelInfo
    """The model that was run."""
    tokens: tuple[Token, ...]
    """The prompt's tokens."""
    layer: int
    """The block recomputed (negative `--layer` values resolved)."""
    head: int
    """The query head whose values and matrices are shown."""
    kv_head: int
    """The key/value head that query head reads."""
    steps: tuple[ExplainStep, ...]
    """Every step: the block's (sections attention and mlp), then the end of the pass (section end)."""
    matrices: tuple[AttentionMatrix, ...]
    """The chosen head's masked scores and weights (prompts of at most 12 tokens; empty otherwise)."""
    checks: tuple[Check, ...]
    """Every comparison with the model and property of the weights."""
    sampling: Sampling
    """The next token under greedy, temperature, top-k and top-p."""
    match: bool
    """True when every check passed: the walkthrough reproduces the model."""
    notes: tuple[str, ...]
    """Sentences a reader should see with the numbers (random weights, truncation, ...)."""
    head_weights: tuple[AttentionMatrix, ...] = ()
    """Every head's attention weights at this layer (with `--plot` and in the report); empty
    otherwise."""
    embedding: tuple[EmbeddingRow, ...] = ()
    """The embedding lookup, token by token: the first values of each part."""
    kind: str = "explain"
    schema_version: str = SCHEMA_VERSION
