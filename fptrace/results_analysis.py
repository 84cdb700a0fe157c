"""Frozen results of `attribute`, `diff` and `patch` (re-exported by results.py)."""

from __future__ import annotations

from dataclasses import dataclass

from .results import SCHEMA_VERSION, ModelInfo, Token, TopToken


@dataclass(frozen=True)
class Contribution:
    """One part of the last position's stream, in logits of the target (or of the difference
    target − versus)."""

    component: str  # embed, attn_head, attn_bias, attn (when heads cannot be split), mlp,
    #                 final_norm_bias, lm_head_bias
    layer: int | None
    head: int | None
    value: float  # logits this part contributes
    share: float  # value / Σ|value| over every part


@dataclass(frozen=True)
class LayerAttribution:
    layer: int
    attn: float  # every head and the W_O bias of this block
    mlp: float


@dataclass(frozen=True)
class Attribution:
    prompt: str
    model: ModelInfo
    tokens: tuple[Token, ...]
    target: TopToken
    versus: TopToken | None
    model_logit: float  # the model's own logit (difference), before any final softcap
    capped_logit: float | None  # after the softcap, for families that have one
    total: float  # the sum of every contribution
    difference: float  # total − model_logit
    tolerance: str
    ok: bool  # the parts sum to the model's logit within the tolerance
    contributions: tuple[Contribution, ...]  # every part, in stream order
    top: tuple[Contribution, ...]  # the largest |value| first
    layers: tuple[LayerAttribution, ...]
    head_grid: tuple[tuple[float, ...], ...]  # layer × head values; () for a block not split
    notes: tuple[str, ...]
    kind: str = "attribution"
    schema_version: str = SCHEMA_VERSION


@dataclass(frozen=True)
class DiffSide:
    label: str  # "a" / "b", or what differs ("float32", "float16", a file name, ...)
    prompt: str
    model: str
    dtype: str
    device: str
    random_weights: bool
    tokens: tuple[tuple[int, str], ...]  # (id, text) of each token


@dataclass(frozen=True)
class LayerDiff:
    layer: int | None  # None: the embedding
    norm_a: float
    norm_b: float
    rel_diff: float | None  # ‖a − b‖ / ‖a‖ of the last position's stream; None: not comparable
    cos: float | None  # cosine between the two streams
    lens_a: str | None  # logit-lens top-1 of each
    lens_b: str | None
    lens_same: bool


@dataclass(frozen=True)
class TokenDiff:
    id: int
    text: str
    rank_a: int | None  # None: not in that run's top-k
    rank_b: int | None
    prob_a: float | None
    prob_b: float | None


@dataclass(frozen=True)
class TraceDiff:
    a: DiffSide
    b: DiffSide
    layers: tuple[LayerDiff, ...]
    tolerance: float  # on rel_diff
    tolerance_reason: str
    first_over: str | None  # "embed" or "block N": the first row over the tolerance
    comparable: bool  # every row has a relative difference
    within: bool  # comparable, and every row within the tolerance (exit 0)
    top_k: tuple[TokenDiff, ...]
    notes: tuple[str, ...]
    kind: str = "diff"
    schema_version: str = SCHEMA_VERSION


@dataclass(frozen=True)
class PatchCell:
    layer: int
    position: int
    prob: float  # the target's probability with this state restored


@dataclass(frozen=True)
class PatchResult:
    prompt: str
    model: ModelInfo
    tokens: tuple[Token, ...]  # the clean prompt's
    corrupt_tokens: tuple[Token, ...]  # the corrupted run's (the same ids, with --noise)
    corruption: str  # "noise" or "prompt"
    subject: str | None  # --noise
    subject_positions: tuple[int, ...]  # the positions the noise was added at
    noise_std: float | None  # the noise's standard deviation
    noise_scale: float  # × the embedding's standard deviation
    seed: int
    what: str  # resid, attn or mlp
    window: int  # layers restored around each row's layer (attn, mlp)
    target: TopToken  # in the clean run
    p_clean: float
    p_corrupt: float
    grid: tuple[tuple[float, ...], ...]  # layers × positions: the target's probability
    best: tuple[PatchCell, ...]  # the cells of highest probability
    forward_passes: int
    notes: tuple[str, ...]
    kind: str = "patch"
    schema_version: str = SCHEMA_VERSION
