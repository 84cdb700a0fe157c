"""The result types several commands share, and the `@result` decorator every result type uses.

Results are frozen dataclasses holding plain floats, ints, strings and tuples: renderers and the
JSON schema read them; none of them holds a torch tensor. Each field is documented by the
docstring right under it: that text is the field's description in `fptrace schema` and
docs/schema.md (commands/schema reads it through pydantic), so it is written for the reader of
the JSON output. A result type that a command prints as JSON has a `kind` field; the schema
finds those types in results.py and in every commands/<name>/result.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


def result(cls: type[T]) -> type[T]:
    """A frozen dataclass whose field docstrings describe its JSON (see the module's text)."""
    cls.__pydantic_config__ = {"use_attribute_docstrings": True}  # type: ignore[attr-defined]
    return dataclass(frozen=True)(cls)


SCHEMA_VERSION = "1.4"  # minor: fields or kinds added; major: a field changed or removed

# One vocabulary of trace points, shared by hooks, JSON keys and table headers: points.py
# (Point) names them, the stream's and those inside a block (ShapeStep.point, LayerStats.point,
# ExplainStep.point, diff --deep).


@result
class ModelInfo:
    """The loaded model."""

    name: str
    """The `--model` alias or the path or hub id given."""
    family: str
    """The architecture family: a family of the registry (`fptrace models` and docs/models.md list
    them), or generic:<model_type> for a model type no family serves."""
    source: str
    """Where the weights came from (a file, folder, hub id, or random weights)."""
    n_layers: int
    """Number of blocks."""
    d_model: int
    """Width of the residual stream."""
    n_heads: int
    """Query heads per attention layer."""
    n_kv_heads: int
    """Key/value heads (fewer than n_heads with grouped-query attention)."""
    head_dim: int
    """Values per head."""
    d_mlp: int | None
    """Width of the MLP's hidden layer, or null if unknown."""
    vocab_size: int
    """Rows of the token embedding."""
    context_length: int | None
    """Longest sequence the positions allow, or null if unknown."""
    n_params: int
    """Parameters, counting tied tensors once."""
    tied_embeddings: bool
    """Whether the LM head is the token embedding matrix."""
    norm_type: str
    """The norm: layernorm, rmsnorm, or rmsnorm (1 + w) (RMSNorm scaled by 1 + γ, Gemma)."""
    mlp_type: str
    """The MLP: gelu (two matrices), swiglu or geglu (gated, three matrices)."""
    positions: str
    """Positions: learned (absolute embeddings) or rope (rotary, inside attention)."""
    parallel_residual: bool
    """Whether attention and the MLP both read the block's input (GPT-NeoX)."""
    device: str
    """Where the model ran (cpu, cuda:0, ...)."""
    dtype: str
    """Precision of the weights and activations."""
    random_weights: bool
    """True when the weights are seeded random, not trained: predictions then mean nothing."""
    placement: tuple[str, ...] = ()
    """With `--device-map`: where each range of blocks and the other parts live (`blocks 0–13:
    cuda:0`, `lm_head: disk`, ...); empty otherwise."""
    # a model type the registry does not know: the facts inferred (and from what), the unknown
    inferred: tuple[str, ...] = ()
    """For a model type no family module covers: each architecture fact fptrace inferred, and from
    what (empty for registered families)."""
    unknown: tuple[str, ...] = ()
    """For such a model: the facts fptrace could not establish, and what it does about each (empty
    for registered families)."""
    tensor_parallel: int = 1
    """How many processes the weights are sharded over (`--tp N` or torchrun); 1 in one process."""
    quantization: str | None = None
    """`int8` or `int4` when the linear layers' weights were quantized on load (`--quantize`,
    torchao's weight-only schemes through transformers; embeddings and LM head stay as they
    are), else null."""
    quantized_weights: int | None = None
    """With `quantization`: how many of the blocks' linear weights were quantized (a load that
    would quantize none is refused), else null."""


@result
class Token:
    """One token of the prompt."""

    position: int
    """Position in the sequence, from 0."""
    id: int
    """Token id."""
    text: str
    """The token's text (a byte fragment shows as its escaped bytes)."""
    template: bool = False
    """True when the model's chat template added this token (`--chat`, `--messages`): a role
    header, a turn marker, the system prompt the template supplies; false for the text of a
    message and for every token of a plain prompt."""


@result
class ShapeStep:
    """The shape of the stream at one step of the forward pass."""

    point: str
    """A trace point: input_ids, embed, resid_pre, attn_out, resid_mid, mlp_out, resid_post,
    final_norm or logits (shapes also uses names of steps inside block 0)."""
    label: str
    """What the step is called in the tables."""
    shape: tuple[int, ...]
    """The tensor's shape."""


@result
class TopToken:
    """A candidate next token."""

    rank: int
    """1 for the most probable (in `sampling.picks`: the strategy's index + 1)."""
    id: int
    """Token id."""
    text: str
    """The token's text."""
    prob: float
    """Probability (softmax of the logits in float32)."""
    logit: float
    """The raw logit."""


@result
class LayerStats:
    """The residual stream after the embedding (layer null) or after one block, at the last position
    unless noted."""

    layer: int | None
    """Block index, or null for the embedding. The embedding row is transformers'
    `hidden_states[0]`; the row of block k is the stream after block k, `hidden_states[k + 1]`
    (except the last block's: transformers' last entry has the final norm applied, see
    `final_norm`)."""
    point: str
    """embed or resid_post."""
    resid_norm_last: float
    """L2 norm of the residual stream at the last position."""
    resid_norm_mean: float
    """Mean over the prompt's positions of the stream's L2 norm."""
    added_norm_last: float | None
    """L2 norm of what the block added (resid_post − resid_pre); null for the embedding."""
    attn_norm_last: float | None
    """L2 norm of what attention added to the stream (for families that normalise the attention
    output before the add, the post-norm output); null for the embedding, and null where the
    decomposition check fails for this block."""
    mlp_norm_last: float | None
    """L2 norm of what the MLP added to the stream (post-norm where the family has one); null for
    the embedding, and where the decomposition check fails."""
    cos_prev: float | None
    """Cosine between this stream and the previous one; null for the embedding."""
    snippet: tuple[float, ...]
    """The first values of the stream at the last position (`--snippet`)."""
    lens_id: int | None
    """Logit lens: top-1 token id of final norm + LM head applied to this stream."""
    lens_text: str | None
    """The logit-lens token's text."""
    lens_prob: float | None
    """The logit-lens token's probability."""
    finite: bool
    """False if the stream holds NaN or Inf anywhere."""
    lens_rank: int | None = None
    """Rank of the final top-1 token in this row's logit-lens distribution (1: the lens already
    predicts it); null without the lens."""
    lens_entropy: float | None = None
    """Entropy of this row's logit-lens distribution, in nats."""
    lens_kl: float | None = None
    """KL divergence from the final distribution to this row's lens distribution, KL(final ‖ lens),
    in nats (0 at the last row)."""
    resid_norm_max: float | None = None
    """The largest ‖stream‖ over the prompt's positions."""
    resid_norm_max_position: int | None = None
    """The position where it is (a position far above the others carries a massive activation,
    usually position 0)."""
    resid_max_channel: int | None = None
    """At the position of the largest ‖resid‖: the channel with the largest |value| (where a
    massive activation sits)."""
    resid_max_value: float | None = None
    """That channel's value there (signed)."""


@result
class Decomposition:
    """The check, run on every trace, that what attention and the MLP added equals what the block
    added: ‖Δ − (attn + mlp)‖ at the last position of every block, against a tolerance that
    allows for the dtype's rounding of the residual adds. Where a block fails it, its
    `attn_norm_last` and `mlp_norm_last` are null rather than wrong."""

    holds: bool
    """True when every block passes: all `attn_norm_last`/`mlp_norm_last` are shown."""
    max_mismatch: float | None
    """The largest ‖Δ − (attn + mlp)‖ / ‖Δ‖ over the blocks (null when no block could be measured)."""
    worst_block: int | None
    """The block with that largest mismatch, or null."""
    withheld: tuple[int, ...]
    """Blocks whose attention and MLP figures are withheld (null)."""
    tolerance: str
    """The rule each block must meet, in words."""

    def note(self) -> str | None:
        """The one line that says why ‖attn‖ and ‖mlp‖ are missing, or None when shown."""
        if self.holds:
            return None
        runs: list[list[int]] = []
        for i in self.withheld:
            if runs and runs[-1][1] == i - 1:
                runs[-1][1] = i
            else:
                runs.append([i, i])
        blocks = ("block " if len(self.withheld) == 1 else "blocks ") + ", ".join(
            str(a) if a == b else f"{a}–{b}" for a, b in runs)
        measured = "" if self.max_mismatch is None else (
            f"; the largest mismatch is {self.max_mismatch:.1%} of ‖Δ‖, at block "
            f"{self.worst_block}")
        from fptrace.notes import WITHHELD

        return WITHHELD(blocks=blocks, measured=measured)


@result
class PositionStats:
    """The model's prediction at one position (`--all-positions`): what it scored for the token that
    actually comes next, and its own top-1."""

    position: int
    """The position."""
    token: Token
    """The token at this position."""
    actual: Token | None
    """The token at the next position (what training scores against), or null at the last position."""
    actual_prob: float | None
    """Its probability under this position's prediction."""
    actual_rank: int | None
    """Its rank (1: the model's top-1)."""
    loss: float | None
    """The cross-entropy −log p(actual), in nats."""
    predicted: TopToken
    """The model's top-1 at this position."""


@result
class FinalNormStats:
    """The output of the final norm at the last position."""

    norm_last: float
    """L2 norm of the final norm's output at the last position."""
    snippet: tuple[float, ...]
    """Its first values."""


@result
class LensCell:
    """The logit lens at one layer and position: top-1 of final norm + LM head."""

    id: int
    """Token id."""
    text: str
    """The token's text."""
    prob: float
    """Its probability."""


@result
class Trace:
    """`fptrace run --json`: one prompt traced through the model."""

    prompt: str
    """The prompt as given (or decoded from the token ids given)."""
    model: ModelInfo
    """The model that was run."""
    tokens: tuple[Token, ...]
    """The token ids that were run, in order."""
    shapes: tuple[ShapeStep, ...]
    """Shape of the stream at each step, from input ids to logits."""
    layers: tuple[LayerStats, ...]
    """Per-layer statistics: the embedding, then one entry per block."""
    final_norm: FinalNormStats
    """The final norm's output at the last position."""
    top_k: tuple[TopToken, ...]
    """The most probable next tokens, from the model's logits at the last position."""
    all_positions: bool
    """Whether the LM head was applied at every position (`--all-positions`)."""
    truncated: int
    """Tokens dropped from the start by `--truncate` (0 if none)."""
    first_nonfinite: str | None
    """Where NaN or Inf first appeared (`embed`, `block N` or `final_norm`), or null."""
    notes: tuple[str, ...]
    """Sentences a reader should see with the numbers (random weights, truncation, ...)."""
    # logit lens at every position (--plot, report): rows embed, block 0, ...; empty otherwise
    lens_grid: tuple[tuple[LensCell, ...], ...] = ()
    """Logit lens at every position (with `--plot` and in the report): one row per layer (embedding
    first), one cell per position of `lens_positions`; empty otherwise."""
    lens_positions: tuple[int, ...] = ()
    """The positions of the grid's columns (the last 64 at most)."""
    decomposition: Decomposition | None = None
    """Whether the attention/MLP split of every block adds up to what the block added (see
    Decomposition); the split figures of a block that fails are null."""
    positions: tuple[PositionStats, ...] = ()
    """With `--all-positions`: the prediction at every position (empty otherwise)."""
    mean_loss: float | None = None
    """With `--all-positions`: the mean cross-entropy (nats) of the predictions that have a next
    token: the loss training averages; else null."""
    perplexity: float | None = None
    """exp(mean_loss), or null."""
    token_note: str | None = None
    """Whether position 0 is a begin-of-text token the tokenizer added, or null when the tokenizer
    has none."""
    tokenize_seconds: float | None = None
    """How long the tokenizer takes to turn the prompt's text into these ids, on the CPU, before
    the model runs: timed on a second (warm) call, since a tokenizer's first call also pays for
    its start-up (null when token ids were given)."""
    kind: str = "trace"
    schema_version: str = SCHEMA_VERSION


@result
class ExplainStep:
    """One step of the walkthrough: a named tensor, how it was computed, and a few values."""

    index: int
    """Step number, from 1."""
    section: str
    """attention, mlp or end."""
    name: str
    """The step, named after the checkpoint's module where there is one."""
    formula: str
    """How the tensor is computed, in one line."""
    shape: tuple[int, ...]
    """The tensor's shape."""
    where: str
    """Which values `preview` holds (e.g. `head 2, pos 4`)."""
    preview: tuple[float, ...]
    """A few of the tensor's values."""
    note: str | None
    """A remark on the step, or null."""
    point: str | None = None
    """The trace point this step's tensor is (`ln1`, `q`, `attn_weights`, `z`, `mlp_act`, ...: the
    names `diff --deep` compares), or null for a step in between."""


@result
class Check:
    """A fact the walkthrough checks about its own numbers."""

    name: str
    """What is checked."""
    value: float
    """What was measured (a max |Δ|, a count, ...)."""
    tolerance: str
    """The rule the value must meet."""
    ok: bool
    """Whether it does."""
    target: str = ""
    """Which check: `embedding`, `softmax_rows`, `causal_zeros`, `attn_out`, `mlp_out`, `block` (the
    recomputed block output) or `logits` (explain); for `attribute --qk`: `qk_stream` (the parts
    sum to the streams), `qk_score` (the terms sum to the score from the streams) or `qk_weights`
    (the recomputed weights equal the model's); `steered_stream` or `lens_logits` (steer);
    `ablated_attention` or `ablated_block` (ablate)."""
    unit: str = "abs"
    """`abs`: the value is a max absolute difference; `count`: it counts elements."""


