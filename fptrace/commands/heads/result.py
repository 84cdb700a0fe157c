"""The result of `fptrace heads`."""

from __future__ import annotations

from fptrace.results import SCHEMA_VERSION, Check, ModelInfo, result

SCHEMA_SINCE = "1.6"  # the `heads` kind arrives




@result
class Evidence:
    """Where a score came from: one query position and the key it gave its attention to."""

    prompt: str
    """The prompt (or `induction[k]` for the k-th sequence of repeated random tokens)."""
    query: int
    """The query position."""
    key: int
    """The position the pattern names for that query (the previous one, an earlier
    occurrence, ...)."""
    weight: float
    """The attention weight the head gives it there."""
    query_text: str
    """The query's token."""
    key_text: str
    """The key's token."""


@result
class HeadScores:
    """One attention head: its pattern scores, its weight scores, what removing it did, and the
    role it is given."""

    layer: int
    """The block."""
    head: int
    """The head within the block."""
    previous: float | None
    """Previous-token score: the mean attention from position i to i − 1 over every query i ≥ 2
    of the prompts (docs/heads.md); null when no prompt has 3 tokens."""
    duplicate: float | None
    """Duplicate-token score: the mean, over queries whose token occurred before (at a position
    ≥ 1), of the attention on those earlier occurrences; null when no token repeats."""
    induction: float | None
    """Induction score: on sequences of seeded random tokens repeated once, the mean attention
    from a token of the second copy to the token after its first occurrence; null with no
    induction sequences."""
    first: float
    """First-token score: the share of the attention of queries i ≥ 1 that lands on position 0
    (the definition of `fptrace stats`' sinks)."""
    subject: float | None
    """Subject score: the mean attention from the last position to the subject's tokens, over
    the prompts that name a subject; null when none does."""
    copying: float | None
    """OV copying share: of the sampled tokens, the share whose own logit is the largest when
    its embedding passes through the head's OV circuit and the LM head; null where the weights
    could not be read."""
    eigen: float | None
    """The OV circuit's eigenvalue sign measure Σλ / Σ|λ| (Elhage et al. 2021): near 1 a
    copying head, near −1 a suppressing one; null with copying."""
    loss_change: float | None
    """With the head removed (zero) at the positions of the repeated half, the change of the
    mean loss on the repeated half of the induction sequences (nats); null where the head was
    not checked."""
    next_share: float | None
    """With one earlier token replaced, the head's output change at the next position over its
    mean change at the later ones (above 1: the head reads the previous token); null where the
    head was not checked."""
    roles: tuple[str, ...]
    """The roles given: `previous-token`, `induction`, `duplicate-token`, `subject` (score over
    its threshold and, where a check exists, confirmed by it), `sink`."""
    pattern_only: tuple[str, ...]
    """The roles whose pattern score clears the threshold while the intervention disagrees."""


@result
class Heads:
    """`fptrace heads --json`: every attention head's pattern and weight scores, the roles they
    support once checked by intervention, and the walkthrough's layer roles held against them."""

    model: ModelInfo
    """The model that was run."""
    prompts: int
    """How many prompts were scored."""
    seed: int
    """The seed of the random induction tokens and of the sampled OV tokens."""
    induction_sequences: int
    """How many sequences of repeated random tokens were scored."""
    induction_length: int
    """The length of one copy (each sequence is twice as long)."""
    clean_loss: float | None
    """The mean loss on the repeated half of the induction sequences, nothing removed (nats)."""
    thresholds: tuple[tuple[str, float], ...]
    """(role, the score it needs)."""
    heads: tuple[HeadScores, ...]
    """Every head, block by block."""
    story: tuple[str, ...]
    """One measured sentence per role, then the walkthrough's claims each marked agrees or
    disagrees."""
    evidence: tuple[Evidence, ...]
    """With `--head L.H`: the positions that made its pattern scores, largest weight first."""
    focus: str | None
    """With `--head L.H`: that head (`L.H`); else null."""
    checks: tuple[Check, ...]
    """Checks of this run's own numbers."""
    ok: bool
    """Whether every check passes."""
    notes: tuple[str, ...]
    """Sentences a reader should see with the numbers."""
    kind: str = "heads"
    schema_version: str = SCHEMA_VERSION
