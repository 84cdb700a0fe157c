"""The result types several commands share, and the `@result` decorator every result type uses.

Results are frozen dataclasses holding plain floats, ints, strings and tuples: renderers and the
JSON schema read them; none of them holds a torch tensor. Each field is documented by the
docstring right under it: that text is the field's description in `fptrace schema` and
docs/schema.md (commands/schema reads it through pydantic), so it is written for the reader of
the JSON output. A result type that a command prints as JSON has a `kind` field; the schema
finds those types in results.py and in every commands/<name>/result.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from typing_extensions import dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)  # type checkers read @result as @dataclass(frozen=True)
def result(cls: type[T]) -> type[T]:
    """A frozen dataclass whose field docstrings describe its JSON (see the module's text)."""
    cls.__pydantic_config__ = {"use_attribute_docstrings": True}  # type: ignore[attr-defined]
    return dataclass(frozen=True)(cls)


# The version of the JSON contract. Major: a field changed or went (edit SCHEMA_BASE). Minor:
# fields or kinds were added; a command folder that adds them says so in its own result.py
# (`SCHEMA_SINCE = "1.4"`, the version its additions arrive in), and the version is the newest
# of those, so a new kind edits nothing outside its folder; SCHEMA_BASE is the version of the
# shared types of this module (1.4: Trace.routing and ModelInfo.moe for mixture-of-experts
# models, Trace.engine; 1.5: the lens grid's cells carry the lens top-k and the stream's norms
# at their position, for the report's page; 1.7: Token.piece). The result modules import this one, so their
# declarations are read as text here, not imported (a test checks the two agree).
SCHEMA_BASE = "1.7"
SINCE = re.compile(r'^SCHEMA_SINCE\s*=\s*"(\d+)\.(\d+)"', re.M)


def schema_version(base: str = SCHEMA_BASE, commands: Path = Path(__file__).parent / "commands"
                   ) -> str:
    """The newest of base and every commands/<name>/result.py's SCHEMA_SINCE."""
    versions = [tuple(int(x) for x in base.split("."))]
    for path in sorted(commands.glob("*/result.py")):
        versions += [(int(a), int(b)) for a, b in SINCE.findall(path.read_text(encoding="utf-8"))]
    major, minor = max(versions)
    return f"{major}.{minor}"


SCHEMA_VERSION = schema_version()

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
    """The MLP: gelu (two matrices), swiglu or geglu (gated, three matrices), or moe (a router and
    routed experts, SwiGLU each, plus shared experts where the family has them)."""
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
    moe: str | None = None
    """For a mixture-of-experts model, its experts in words (`8 experts, 2 active (+ 1 shared),
    d_expert 14336`); d_mlp is then one routed expert's width. Null for a dense model."""
    quantized_weights: int | None = None
    """With `quantization`: how many of the blocks' linear weights were quantized (a load that
    would quantize none is refused), else null."""


@result
class BlockRoute:
    """The routing of one MoE block at every position of the prompt, one entry per position
    (position 0 first) in each list."""

    layer: int
    """The block."""
    experts: tuple[tuple[int, ...], ...]
    """Per position: the routed experts chosen, by weight, largest first (shared experts are
    always taken and not listed)."""
    weights: tuple[tuple[float, ...], ...]
    """Per position: what each chosen expert's output is multiplied by, as the model's router
    returned it."""
    mass: tuple[float, ...]
    """Per position: the router's probability mass on the chosen experts: the softmax of its
    logits over all experts (softmax and top-k-softmax routers) or each sigmoid score over their
    sum (sigmoid routers), summed over the chosen ones."""
    entropy: tuple[float, ...]
    """Per position: the entropy of that distribution over all experts, in nats (ln E: uniform;
    0: one expert)."""


@result
class Routing:
    """A mixture-of-experts model's routing in one forward pass, captured by a hook on each MoE
    block's router and checked against the family's routing rule recomputed from the router's
    logits."""

    n_experts: int
    """Routed experts per MoE block."""
    top_k: int
    """Routed experts each position takes."""
    n_shared: int
    """Shared experts each position takes besides (0: none)."""
    d_expert: int
    """Hidden width of one routed expert."""
    scoring: str
    """How the router scores experts: softmax, sigmoid, or softmax over the top k."""
    renormalised: bool
    """Whether the chosen experts' scores are divided by their sum."""
    blocks: tuple[BlockRoute, ...]
    """Every MoE block (dense blocks have none), every position."""
    checked: bool
    """True when the family's rule, recomputed from the router's logits, chose the same experts
    with the same weights (within the dtype's tolerance) at every block and position."""
    mismatched: int
    """Block-positions where the recomputed choice differs from the router's (0 when checked)."""
    max_weight_error: float
    """Largest |recomputed weight − the router's weight| over the matching choices."""


@result
class Token:
    """One token of the prompt."""

    position: int
    """Position in the sequence, from 0."""
    id: int
    """Token id."""
    text: str
    """The token's text (a byte fragment shows as its escaped bytes)."""
    piece: str | None = None
    """The vocabulary's own string for the id ('Ġcat', '▁Paris', '<0x0A>'), as `fptrace tokens`
    shows it; null where the tokenizer keeps no piece strings."""
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
    """The stream at one layer and position: the logit lens (final norm + LM head applied to it)
    and the sizes of the stream and of what the block added there."""

    id: int
    """Token id."""
    text: str
    """The token's text."""
    prob: float
    """Its probability."""
    top_k: tuple[TopToken, ...] = ()
    """The lens's most probable tokens at this layer and position (the first is id/text/prob; the
    logit is the lens's own)."""
    resid_norm: float | None = None
    """L2 norm of the stream at this layer and position."""
    added_norm: float | None = None
    """L2 norm of what the block added at this position (resid_post − resid_pre); null for the
    embedding row."""
    attn_norm: float | None = None
    """L2 norm of what attention added at this position; null for the embedding row, and where
    attention + MLP do not make up what the block added at this position (the check of
    `Decomposition`, at every position)."""
    mlp_norm: float | None = None
    """L2 norm of what the MLP added at this position; null as attn_norm."""


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
    routing: Routing | None = None
    """For a mixture-of-experts model: the experts each block chose at every position of the
    prompt, their weights, the router's mass on them and its entropy; null for a dense model."""

    engine: str = "transformers"
    """What computed the pass: transformers, or llama.cpp (`--engine llama.cpp`: the rows are
    llama.cpp's own tensors, `embd` and `l_out-k`; the lens is the checkpoint's final norm and
    head on them)."""
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
    """Which check: each command that checks its numbers names its targets in its result module
    (CHECK_TARGETS); `fptrace schema` writes them all here."""
    unit: str = "abs"
    """`abs`: the value is a max absolute difference; `count`: it counts elements."""


@result
class QKPart:
    """One part of the residual stream at the query's or the key's position (what block `layer`
    reads there)."""

    component: str
    """`embed` (the token embedding, scaled where the family scales it), `pos_embed` (the learned
    position embedding), `attn_head`, `attn_bias` (a block's W_O bias, through its post-norm where
    it has one), `attn` (a block whose heads could not be split exactly), `mlp`, `bias` (the
    constant of this side: the norm's bias through W_Q or W_K, plus the projection's bias), or
    `rest` (in the grid: every part not shown)."""
    layer: int | None
    """The block that wrote it, or null."""
    head: int | None
    """The attention head, or null."""


@result
class QKPartSum:
    """One part of one side, with every term it is in summed over the other side's parts."""

    part: QKPart
    """The part."""
    value: float
    """Its share of the score: Σ over the other side's parts of the terms it is in."""
    norm: float
    """‖what this part adds to q (or k)‖: its size, whatever the other side's direction."""


@result
class QKTerm:
    """One term of the score: a part of the query's stream × a part of the key's stream."""

    query: QKPart
    """The part of the query position's stream."""
    key: QKPart
    """The part of the key position's stream."""
    value: float
    """scale · q(query part) · k(key part): through the frozen norms, the projections, the q/k
    norms and the rotary rotation of each position."""
    share: float
    """value / the sum of |value| over every term."""
