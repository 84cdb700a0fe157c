"""The result of `fptrace diff`."""

from __future__ import annotations

from fptrace.core.results import SCHEMA_VERSION, result


@result
class DiffSide:
    """One of the two runs compared."""

    label: str
    """`a`, `b`, or the file the trace came from."""
    prompt: str
    """The prompt."""
    model: str
    """The model's name."""
    dtype: str
    """Its dtype."""
    device: str
    """Its device."""
    random_weights: bool
    """Whether its weights were random."""
    tokens: tuple[tuple[int, str], ...]
    """The (id, text) of each token."""


@result
class LayerDiff:
    """One layer of both runs: the last position's stream compared."""

    layer: int | None
    """The block, or null for the embedding."""
    norm_a: float
    """‖stream‖ at the last position in a."""
    norm_b: float
    """The same in b."""
    rel_diff: float | None
    """‖a − b‖ / ‖a‖ of the last position's stream; null when the traces do not hold the whole
    stream or differ in width."""
    cos: float | None
    """The cosine between the two streams; null as above."""
    lens_a: str | None
    """The logit-lens top-1 token of a."""
    lens_b: str | None
    """The same of b."""
    lens_same: bool
    """Whether they are the same token."""


@result
class TokenDiff:
    """A token in the top-k of either run, with its rank and probability in both."""

    id: int
    """Token id."""
    text: str
    """The token's text."""
    rank_a: int | None
    """Its rank in a's top-k, or null when it is not in it."""
    rank_b: int | None
    """The same in b."""
    prob_a: float | None
    """Its probability in a, or null."""
    prob_b: float | None
    """The same in b."""


@result
class TraceDiff:
    """`fptrace diff --json`: two traces compared layer by layer."""

    a: DiffSide
    """The first run."""
    b: DiffSide
    """The second run."""
    layers: tuple[LayerDiff, ...]
    """The embedding, then one row per block."""
    tolerance: float
    """The largest relative difference that counts as the same."""
    tolerance_reason: str
    """Where the tolerance comes from (`--tolerance`, or the default for the coarser dtype)."""
    first_over: str | None
    """`embed` or `block N`: the first row whose relative difference exceeds the tolerance; null
    when none does."""
    comparable: bool
    """Every row has a relative difference (both traces hold the whole stream and have the same
    width and number of blocks)."""
    within: bool
    """Comparable and within the tolerance at every row: `fptrace diff` exits 0, else 1."""
    top_k: tuple[TokenDiff, ...]
    """The tokens of both top-k lists, with ranks and probabilities in each."""
    notes: tuple[str, ...]
    """Sentences a reader should see with the numbers (random weights, truncation, ...)."""
    kind: str = "diff"
    schema_version: str = SCHEMA_VERSION


@result
class ChannelMove:
    """One channel of one site, in two statistics files."""

    layer: int | None
    """The block (null for the final norm's output)."""
    site: str
    """attn_in, z, mlp_in, mlp_act, resid_post or final_norm (see docs/stats.md)."""
    channel: int
    """The channel."""
    absmax_a: float
    """Largest |x| in the first file."""
    absmax_b: float
    """... in the second."""
    change: float
    """How far the channel's scale moved: |absmax_b − absmax_a| / absmax_a, the denominator at
    least 1 % of the site's largest absmax_a."""
    mean_a: float
    """Mean in the first file."""
    mean_b: float
    """... in the second."""
    std_a: float
    """Population standard deviation in the first file."""
    std_b: float
    """... in the second."""


@result
class SiteMove:
    """How far one site's channel scales moved."""

    layer: int | None
    """The block (null for the final norm's output)."""
    site: str
    """The site."""
    median_change: float
    """The median over its channels of `change` (see ChannelMove)."""
    max_change: float
    """The largest."""
    channel: int
    """The channel that moved most."""


@result
class StatsDiff:
    """`fptrace diff --stats A.json B.json --json`: two statistics files (`fptrace stats --out`)
    compared channel by channel."""

    a: str
    """The first file."""
    b: str
    """The second file."""
    model_a: str
    """The model of the first ..."""
    model_b: str
    """... and of the second."""
    prompts_a: int
    """Prompts counted in the first ..."""
    prompts_b: int
    """... and in the second."""
    same_prompts: bool
    """Whether both count the same prompt ids (else the prompts differ as well as the models)."""
    sites: tuple[SiteMove, ...]
    """Every site, layer by layer."""
    channels: tuple[ChannelMove, ...]
    """The channels that moved most, over every site (largest change first)."""
    notes: tuple[str, ...]
    """What to know when reading the numbers."""
    kind: str = "stats_diff"
    schema_version: str = SCHEMA_VERSION
