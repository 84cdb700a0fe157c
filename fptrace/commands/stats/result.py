"""The result of `fptrace stats`: what the activations look like over many prompts (the findings
the terminal shows) and every statistic behind them (what `--out` keeps and `--merge` reads)."""

from __future__ import annotations

from fptrace.core.activation_stats import Statistics
from fptrace.results import SCHEMA_VERSION, ModelInfo, result

SCHEMA_SINCE = "1.5"  # Stats.experts (ExpertLoad); statistics.experts and .routing


@result
class StatsSettings:
    """The thresholds the findings were drawn with."""

    massive_min: float
    """Massive activation: |x| above this (Sun et al., 2024: 100) ..."""
    massive_ratio: float
    """... and at least this many times the median |x| of its hidden state (1000)."""
    outlier_min: float
    """LLM.int8() outlier dimension: |x| at least this (6) ..."""
    outlier_positions: float
    """... at this share of the positions or more (0.06) ..."""
    outlier_layers: float
    """... in this share of the layers or more (0.25), at the input of the attention or of the
    MLP."""
    sink_threshold: float
    """An attention-sink head gives at least this share of its attention to one position."""
    sink_positions: int
    """The first positions whose share of attention is tallied."""
    top: int
    """Top channels shown per layer."""


@result
class Share:
    """A value and how often it occurred."""

    value: int
    """A position, or a token id."""
    text: str
    """The token's text (empty for a position)."""
    count: int
    """Occurrences."""
    share: float
    """count / all occurrences."""


@result
class MassiveActivation:
    """A channel of the residual stream with massive activations."""

    channel: int
    """The channel."""
    layers: tuple[int, ...]
    """The blocks whose output has them in this channel."""
    value: float
    """The largest, signed."""
    layer: int
    """The block where the largest occurred."""
    ratio: float | None
    """Its ratio to the median |x| of its hidden state (null when that median is 0)."""
    prompt: str
    """The id of the prompt where the largest occurred."""
    position: int
    """Its position."""
    count: int
    """Massive entries, over all layers and prompts."""
    prompt_share: float
    """The share of the prompts where it occurs (in the layer where it occurs most)."""
    positions: tuple[Share, ...]
    """Where they occur: the most frequent positions."""
    tokens: tuple[Share, ...]
    """On which tokens: the most frequent."""


@result
class OutlierDimension:
    """A hidden dimension that is an outlier feature in the sense of LLM.int8()."""

    channel: int
    """The dimension."""
    layers: tuple[int, ...]
    """The blocks where it reaches the threshold at enough positions (attention or MLP input)."""
    share: float
    """The largest share of positions with |x| at or above the threshold, over those inputs."""
    absmax: float
    """The largest |x| over those inputs."""


@result
class TopChannel:
    """One of a layer's channels with the largest |x| in the residual stream."""

    layer: int
    """The block."""
    rank: int
    """1 for the largest."""
    channel: int
    """The channel."""
    value: float
    """The signed value of the largest |x|."""
    mean: float
    """Mean over every position of every prompt."""
    std: float
    """Population standard deviation, likewise."""
    prompt: str
    """Where the largest occurred: the prompt's id, ..."""
    position: int
    """... the position, ..."""
    token: int
    """... the token id ..."""
    text: str
    """... and its text."""


@result
class SinkHead:
    """Where one attention head looks most, on average."""

    layer: int
    """The block."""
    head: int
    """The head."""
    position: int
    """Its most-attended position (among the first sink_positions)."""
    mass: float
    """The share of its attention (from every later position, over all prompts) that lands
    there."""
    token: int
    """The most frequent token at that position ..."""
    text: str
    """... its text ..."""
    token_share: float
    """... and the share of the prompts that have it there."""
    sink: bool
    """Whether mass reaches the sink threshold."""


@result
class ExpertLoad:
    """One mixture-of-experts block's expert load over every position counted."""

    layer: int
    """The block."""
    positions: int
    """Positions routed."""
    load: tuple[int, ...]
    """Per routed expert: the positions whose router chose it."""
    never_chosen: tuple[int, ...]
    """The experts no position chose."""
    max_over_mean: float
    """The largest load over the mean load (1: perfectly balanced; E/k: one expert's worth of
    positions on every choice ... the larger, the less balanced)."""
    cv: float
    """The coefficient of variation of the load: its standard deviation (over the experts) over
    its mean (0: balanced)."""
    entropy: float
    """The router's mean entropy per position, in nats (ln E: uniform over the experts)."""


@result
class Stats:
    """`fptrace stats`: per-channel statistics of every layer's activations over many prompts,
    with the massive activations, outlier dimensions, top channels and attention sinks they
    show."""

    model: ModelInfo
    """The model the statistics are of."""
    settings: StatsSettings
    """The thresholds of the findings below."""
    prompts: int
    """Prompts counted."""
    failed: int
    """Prompts not counted (see `statistics.failed`)."""
    tokens: int
    """Token positions counted."""
    massive: tuple[MassiveActivation, ...]
    """Massive activations, by channel (largest first); empty when there are none."""
    outliers: tuple[OutlierDimension, ...]
    """LLM.int8() outlier dimensions (most layers first)."""
    top_channels: tuple[TopChannel, ...]
    """Per layer, its top channels by largest |x| in the residual stream."""
    sink_heads: tuple[SinkHead, ...]
    """Every head's most-attended position (empty with --no-sinks)."""
    notes: tuple[str, ...]
    """What to know when reading the numbers."""
    statistics: Statistics
    """Everything accumulated: what `--merge` and `--resume` read back."""
    experts: tuple[ExpertLoad, ...] = ()
    """A mixture of experts: per MoE block, its expert load, imbalance and router entropy
    (empty for a dense model)."""
    weights: str | None = None
    """A fingerprint of the model's tensors (names, dtypes, shapes, bytes): `--merge` and
    `--resume` refuse statistics of other weights, whatever their name; null when the tensors
    could not be read (offloaded, sharded, counted on a Ray cluster)."""
    kind: str = "stats"
    schema_version: str = SCHEMA_VERSION
