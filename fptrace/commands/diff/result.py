"""The result of `fptrace diff`."""

from __future__ import annotations

from fptrace.results import SCHEMA_VERSION, result

SCHEMA_SINCE = "1.5"  # TraceDiff.routing (RoutingDiff, RoutingFlip), TraceDiff.emulation


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
    quantization: str | None
    """`int8` or `int4` when its weights were quantized on load, else null."""
    tokens: tuple[tuple[int, str], ...]
    """The (id, text) of each token."""
    quantized_weights: int | None = None
    """With `quantization`: how many linear weights were quantized."""


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
class ErrorShare:
    """A head or channel and its share of the error ‖a − b‖² at a point."""

    index: int
    """The head (query heads, or key/value heads for k and v) or the channel (last dimension)."""
    share: float | None
    """Its part of ‖a − b‖², from 0 to 1; null where a value is NaN or infinite (then the heads
    or channels listed are those holding such values, most first)."""


@result
class PointDiff:
    """One point inside one block (points.py), both runs compared over every position."""

    point: str
    """The point's name: ln1, q, k, v, attn_weights, z, attn_out, ln1_post, resid_mid, ln2,
    mlp_gate, mlp_up, mlp_act, mlp_out, ln2_post, resid_pre (the block's input) or resid_post
    (its output)."""
    recorded: bool
    """True when it is a module's own input or output, hooked; false for q, k and v, recomputed
    from the projections' hooked outputs with each side's own config (their norms and RoPE)."""
    shape: tuple[int, ...]
    """Its shape in a."""
    rel: float | None
    """‖a − b‖ / ‖a‖ over the whole tensor; null (listed in `nonfinite`) where a value is NaN or
    infinite in either run."""
    max_abs: float | None
    """The largest |a − b|."""
    nonfinite: bool
    """Either run has a NaN or infinite value here."""
    inputs: tuple[str, ...]
    """The points it is computed from (empty for block 0's input: the token ids)."""
    inputs_rel: float | None
    """The largest `rel` of those inputs (0 when there are none; null when they were not
    compared: the input of the first block compared, past block 0)."""
    heads: tuple[ErrorShare, ...]
    """For q, k, v, attn_weights and z: the heads carrying most of the error (at most 5)."""
    channels: tuple[ErrorShare, ...]
    """For the other points: the channels carrying most of the error (at most 5)."""


@result
class BlockDiff:
    """One block compared point by point."""

    layer: int
    """The block."""
    points: tuple[PointDiff, ...]
    """Its points, in the order the data flows."""
    worst: str | None
    """The point with the largest relative difference (a non-finite one first)."""
    worst_rel: float | None
    """Its relative difference."""


@result
class LensDiff:
    """One row of the stream at the last position: what the logit lens and the channels say."""

    layer: int | None
    """The block, or null for the embedding."""
    kl: float | None
    """KL(a ‖ b) of the two logit-lens distributions: each run's own final norm and LM head
    applied to its own stream (the last block's row is the models' own final logits)."""
    channels: tuple[ErrorShare, ...]
    """The 5 channels of the stream carrying most of ‖a − b‖² at the last position."""


@result
class Parting:
    """Where the two runs part: the first point over the tolerance, in block order and the order
    the data flows."""

    layer: int
    """The block."""
    point: str
    """The point."""
    rel: float | None
    """Its relative difference (null when a value is NaN or infinite)."""
    nonfinite: bool
    """A run has NaN or infinite values there (an overflow, say)."""
    cause: str
    """`operation` when its inputs agree (within the tolerance, and the difference grows more
    than tenfold across it): the operation itself differs; `upstream` when the inputs already
    differ and the operation carries it on."""
    inputs: tuple[str, ...]
    """The points it is computed from."""
    inputs_rel: float | None
    """The largest relative difference among them (null when not compared)."""
    block_input_rel: float | None
    """The relative difference of the block's input (resid_pre)."""
    heads: tuple[ErrorShare, ...]
    """The heads carrying the error (per-head points)."""
    channels: tuple[ErrorShare, ...]
    """The channels carrying the error (other points)."""
    sentence: str
    """The verdict in one sentence."""


@result
class DeepDiff:
    """`diff --deep`: inside every block, the points explain names, compared."""

    family_a: str
    """The family of a's model."""
    family_b: str
    """The family of b's model."""
    compared: bool
    """Whether the points were compared: the same family, block count and head layout on both
    sides (else only the block level, and a note says why)."""
    layers: tuple[int, ...]
    """The blocks compared point by point (`--deep-layers`, else all)."""
    points: tuple[str, ...]
    """The points of this family's blocks, in the order the data flows."""
    recomputed: tuple[str, ...]
    """The points no module shows, recomputed from each side's own hooked projections and
    config: q, k, v; every other point is a module's own input or output."""
    tolerance: float
    """The largest relative difference of a point that counts as the same (the diff's)."""
    blocks: tuple[BlockDiff, ...]
    """One per block compared."""
    lens: tuple[LensDiff, ...]
    """The embedding, then one row per block: the logit lens KL and the error's channels."""
    parted: Parting | None
    """The first point over the tolerance, or null when every point agrees."""
    notes: tuple[str, ...]
    """What a reader should know with these numbers."""


@result
class RoutingFlip:
    """One block and position where the two runs' routers chose different sets of experts."""

    layer: int
    """The block."""
    position: int
    """The position."""
    text: str
    """The token there (of the first run)."""
    experts_a: tuple[int, ...]
    """The experts the first run chose there, by weight (largest first) ..."""
    weights_a: tuple[float, ...]
    """... and their weights."""
    experts_b: tuple[int, ...]
    """The experts the second run chose there ..."""
    weights_b: tuple[float, ...]
    """... and their weights."""


@result
class RoutingDiff:
    """Two mixture-of-experts runs' routing, block by block and position by position."""

    compared: int
    """Block-positions compared (every MoE block at every position both runs hold)."""
    flipped: int
    """Those where the chosen sets of experts differ."""
    flips: tuple[RoutingFlip, ...]
    """The flips, by block then position (the first `--top`-like 50 of them)."""
    first: RoutingFlip | None
    """The first flip (lowest block, then position); null when the runs route alike."""
    parted_before: float | None
    """Before the first flip's block (the stream entering it), ‖a − b‖ / ‖a‖ at the last position:
    how far the runs had parted before routing flipped; null when unknown."""
    parted_at: float | None
    """After that block, the same: how far the outputs part there; null when unknown."""


@result
class EmulationRung:
    """One rung of `--emulate`'s ladder: transformers with some of llama.cpp's numerics, against
    llama.cpp."""

    steps: tuple[str, ...]
    """The steps on (none for the first rung)."""
    label: str
    """`off`, then `+STEP` for the step this rung adds."""
    rel: tuple[float | None, ...]
    """Per row of `layers` (the embedding, then each block): ‖a − b‖ / ‖a‖ of the last
    position's stream, as `layers[i].rel_diff` with these steps on."""
    worst: float | None
    """The largest of `rel` over the blocks."""
    median: float | None
    """Their median."""
    alone: tuple[float | None, ...] = ()
    """Per block: the error the block adds on its own with these steps on, ‖a − b‖ / ‖a‖ over
    every position of its output when transformers' block is fed llama.cpp's own input (its
    output of the block before), so that no error carried in from upstream counts."""
    alone_worst: float | None = None
    """The largest of `alone`."""
    alone_median: float | None = None
    """Their median."""


@result
class Emulation:
    """`diff --engine-b llama.cpp --emulate STEPS`: llama.cpp's numerics reproduced on the
    transformers side, step by step (docs/llamacpp.md)."""

    steps: tuple[str, ...]
    """The steps, in the order they were added (the main comparison has them all on)."""
    cache: str
    """The K/V cache type the `kv` step rounds to (llama.cpp's --kv-cache)."""
    kernel: str
    """The attention kernel the `attn` step reproduces: `flash` or `plain` (--flash-attn)."""
    rungs: tuple[EmulationRung, ...]
    """off, then each step added in turn; the last rung is the main comparison."""
    fall: float | None
    """The largest block error with no step on, divided by the largest with every step on."""
    fall_alone: float | None = None
    """The same for the error each block adds on its own (`alone`)."""


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
    """Comparable and within the tolerance at every row (and, with `--deep`, at every point):
    `fptrace diff` exits 0, else 1."""
    top_k: tuple[TokenDiff, ...]
    """The tokens of both top-k lists, with ranks and probabilities in each."""
    notes: tuple[str, ...]
    """Sentences a reader should see with the numbers (random weights, truncation, ...)."""
    deep: DeepDiff | None = None
    """With `--deep`: the points inside the blocks compared; null otherwise."""
    routing: RoutingDiff | None = None
    """Two runs of a mixture of experts on the same tokens: where their routing flips; null
    otherwise."""
    emulation: Emulation | None = None
    """With `--engine-b llama.cpp --emulate`: the per-block error with each step on; null
    otherwise."""
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
