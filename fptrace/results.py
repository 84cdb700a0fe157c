"""Frozen result types. They hold plain floats, ints, strings and tuples: renderers and the JSON
schema read them; none of them holds a torch tensor."""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = "1.2"  # minor: fields or kinds added; major: a field changed or removed

# One vocabulary of trace points, shared by hooks, JSON keys and table headers: embed,
# resid_pre, attn_out, resid_mid, mlp_out, resid_post, final_norm, logits (ShapeStep.point,
# LayerStats.point).


@dataclass(frozen=True)
class ModelInfo:
    name: str
    family: str
    source: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_mlp: int | None
    vocab_size: int
    context_length: int | None
    n_params: int
    tied_embeddings: bool
    norm_type: str
    mlp_type: str
    positions: str
    parallel_residual: bool
    device: str
    dtype: str
    random_weights: bool
    placement: tuple[str, ...] = ()  # with --device-map: "blocks 0–13: cuda:0", ...
    # a model type the registry does not know: the facts inferred (and from what), the unknown
    inferred: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    tensor_parallel: int = 1  # ranks the weights are sharded over (torchrun / --tp)


@dataclass(frozen=True)
class Token:
    position: int
    id: int
    text: str


@dataclass(frozen=True)
class ShapeStep:
    point: str  # a trace point, or "input_ids"
    label: str  # what the user reads, e.g. "block 3"
    shape: tuple[int, ...]


@dataclass(frozen=True)
class TopToken:
    rank: int
    id: int
    text: str
    prob: float
    logit: float


@dataclass(frozen=True)
class LayerStats:
    """The residual stream after one step: the embedding (layer None) or block `layer`."""

    layer: int | None
    point: str  # "embed" or "resid_post"
    resid_norm_last: float  # ||resid|| at the last position
    resid_norm_mean: float  # mean over positions of ||resid||
    added_norm_last: float | None  # ||resid_post - resid_pre|| at the last position
    attn_norm_last: float | None  # ||attn_out|| at the last position
    mlp_norm_last: float | None  # ||mlp_out|| at the last position
    cos_prev: float | None  # cosine(resid_post, resid_pre) at the last position
    snippet: tuple[float, ...]  # first values of the last position
    lens_id: int | None  # logit lens: final norm + LM head on this layer's stream, top-1
    lens_text: str | None
    lens_prob: float | None
    finite: bool  # no NaN/Inf anywhere in this layer's stream
    lens_rank: int | None = None  # rank of the final top-1 token in this row's lens (1 = top)
    lens_entropy: float | None = None  # entropy of this row's lens distribution, nats
    lens_kl: float | None = None  # KL(final ‖ lens), nats
    resid_norm_max: float | None = None  # the largest ‖resid‖ over the positions
    resid_norm_max_position: int | None = None  # where it is


@dataclass(frozen=True)
class Decomposition:
    """The check, on every trace, that what attention and the MLP added is what the block
    added: ‖Δ − (attn + mlp)‖ at the last position of every block, against a tolerance that
    allows for the dtype's rounding of the residual adds."""

    holds: bool  # every block within tolerance: the ‖attn‖ and ‖mlp‖ figures are shown
    max_mismatch: float | None  # max over blocks of ‖Δ − (attn + mlp)‖ / ‖Δ‖
    worst_block: int | None  # where that maximum is
    withheld: tuple[int, ...]  # blocks whose ‖attn‖ and ‖mlp‖ are withheld (null)
    tolerance: str  # the rule each block must meet

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
        return (f"‖attn‖ and ‖mlp‖ withheld for {blocks}: what the attention and MLP modules "
                f"output does not add up to what the block added to the stream{measured}; "
                "the other columns are exact")


@dataclass(frozen=True)
class PositionStats:
    """The model's prediction at one position (with --all-positions): what it scored for the
    token that actually comes next, and its own top-1."""

    position: int
    token: Token  # the token at this position
    actual: Token | None  # the token at position + 1 (None at the last position)
    actual_prob: float | None
    actual_rank: int | None  # 1: the model's top-1
    loss: float | None  # cross-entropy −log p(actual), nats
    predicted: TopToken  # the model's top-1 here


@dataclass(frozen=True)
class FinalNormStats:
    norm_last: float
    snippet: tuple[float, ...]


@dataclass(frozen=True)
class LensCell:
    """Logit lens at one (layer, position): the top-1 token of final norm + LM head."""

    id: int
    text: str
    prob: float


@dataclass(frozen=True)
class Trace:
    prompt: str
    model: ModelInfo
    tokens: tuple[Token, ...]
    shapes: tuple[ShapeStep, ...]
    layers: tuple[LayerStats, ...]
    final_norm: FinalNormStats
    top_k: tuple[TopToken, ...]
    all_positions: bool
    truncated: int  # tokens dropped from the start by --truncate
    first_nonfinite: str | None  # "embed" or "block N": where NaN/Inf first appeared
    notes: tuple[str, ...]
    # logit lens at every position (--plot, report): rows embed, block 0, ...; empty otherwise
    lens_grid: tuple[tuple[LensCell, ...], ...] = ()
    lens_positions: tuple[int, ...] = ()  # the positions of the grid's columns
    decomposition: Decomposition | None = None
    positions: tuple[PositionStats, ...] = ()  # --all-positions: every position's prediction
    mean_loss: float | None = None  # --all-positions: the mean of the positions' losses, nats
    perplexity: float | None = None  # exp(mean_loss)
    token_note: str | None = None  # whether a begin-of-text token was added, and by whom
    kind: str = "trace"
    schema_version: str = SCHEMA_VERSION


@dataclass(frozen=True)
class ParamGroup:
    name: str
    count: int  # parameters in one instance
    times: int  # how many instances (blocks)
    shape: tuple[int, ...] = ()  # the tensor's shape
    part: str = ""  # embedding, block, final, head or other


@dataclass(frozen=True)
class CostReport:
    weights_bytes: dict  # precision -> bytes of all weights
    kv_cache_per_token_bytes: int
    kv_cache_bytes: int  # at the report's batch and sequence length
    residual_per_layer_bytes: int
    logits_all_numbers: int
    logits_all_bytes: int
    logits_last_numbers: int
    logits_last_bytes: int
    tied_saving_params: int
    flops_prefill: int
    flops_decode_step: int
    matmul_params: int


@dataclass(frozen=True)
class GpuPlan:
    """How many GPUs of a given memory the weights and the KV cache need, and the smallest
    tensor-parallel size that splits the model that far."""

    gpu_memory_bytes: int
    weights_bytes: int  # in the report's dtype
    kv_cache_bytes: int  # at the report's batch and sequence length
    needed_bytes: int  # weights + KV cache (activations and framework overhead not counted)
    gpus_needed: int  # ceil(needed / gpu memory)
    tp: int | None  # the smallest divisor of both head counts ≥ gpus_needed; None: none is
    tp_note: str


@dataclass(frozen=True)
class ShapeReport:
    model: str
    family: str
    source: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_mlp: int | None
    vocab_size: int
    context_length: int | None
    norm_type: str
    mlp_type: str
    positions: str
    tied_embeddings: bool
    batch: int
    seq_len: int
    tokens: tuple[Token, ...]
    tokenizer: str | None
    steps: tuple[ShapeStep, ...]
    hidden_states: tuple  # (count, shape of each)
    params: tuple[ParamGroup, ...]
    n_params: int
    cost: CostReport
    dtype: str
    differences: tuple[str, ...]
    notes: tuple[str, ...]
    seconds: float
    plan: GpuPlan | None = None  # --gpu-memory
    kind: str = "shapes"
    schema_version: str = SCHEMA_VERSION


@dataclass(frozen=True)
class ExplainStep:
    """One line of the walkthrough: a named tensor, how it was computed, and a few values."""

    index: int
    section: str  # "attention", "mlp" or "end"
    name: str
    formula: str
    shape: tuple[int, ...]
    where: str  # which values `preview` holds, e.g. "pos 2, first 4" or "head 1, pos 2"
    preview: tuple[float, ...]
    note: str | None


@dataclass(frozen=True)
class AttentionMatrix:
    """A (T, T) matrix of one head, rows = query positions, columns = key positions."""

    name: str  # "scores + mask" or "weights"
    head: int
    labels: tuple[str, ...]  # token strings, one per position
    rows: tuple[tuple[float, ...], ...]


@dataclass(frozen=True)
class Check:
    """A fact the walkthrough asserts about its own numbers."""

    name: str
    value: float  # the measured quantity (a max |Δ|, a count, ...)
    tolerance: str  # the rule it must meet, e.g. "|Δ| ≤ 1e-05 + 1e-05·|model|" or "= 0"
    ok: bool
    target: str = ""  # what is checked: softmax_rows, causal_zeros, attn_out, mlp_out, block, logits
    unit: str = "abs"  # "abs": value is a max |difference|; "count": value counts elements


@dataclass(frozen=True)
class SamplingRow:
    id: int
    text: str
    logit: float
    probs: tuple[float, ...]  # one per strategy


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_k: int
    top_p: float
    seed: int
    strategies: tuple[str, ...]
    kept: tuple[int, ...]  # tokens with non-zero probability, per strategy
    picks: tuple[TopToken, ...]  # the token each strategy chose (rank = strategy index + 1)
    rows: tuple[SamplingRow, ...]


@dataclass(frozen=True)
class EmbeddingRow:
    """The embedding lookup of one token: the first values of each part and of the sum."""

    position: int
    id: int
    text: str
    token_row: tuple[float, ...]  # row `id` of the token embedding matrix
    position_row: tuple[float, ...] | None  # row `position` of the position matrix (GPT-2)
    scale: float | None  # the embedding's multiplier (Gemma: √d), else null
    stream: tuple[float, ...]  # what enters block 0


@dataclass(frozen=True)
class Explanation:
    prompt: str
    model: ModelInfo
    tokens: tuple[Token, ...]
    layer: int
    head: int
    kv_head: int  # the key/value head the chosen query head reads (grouped-query attention)
    steps: tuple[ExplainStep, ...]
    matrices: tuple[AttentionMatrix, ...]
    checks: tuple[Check, ...]
    sampling: Sampling
    match: bool  # every check passed: the walkthrough reproduces the model
    notes: tuple[str, ...]
    head_weights: tuple[AttentionMatrix, ...] = ()  # every head's weights (--plot, report)
    embedding: tuple[EmbeddingRow, ...] = ()  # the lookup, token by token
    kind: str = "explain"
    schema_version: str = SCHEMA_VERSION


@dataclass(frozen=True)
class ModelEntry:
    alias: str
    family: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    context_length: int | None
    tokenizer: str | None
    weights: str
    hub_id: str | None
    description: str
    source: str


@dataclass(frozen=True)
class ModelList:
    models: tuple[ModelEntry, ...]
    kind: str = "models"
    schema_version: str = SCHEMA_VERSION


@dataclass(frozen=True)
class GenStep:
    """One forward pass of generation: the prefill (index 0) or one decode step."""

    index: int
    phase: str  # "prefill" or "decode"
    input_shape: tuple[int, ...]  # (1, T) for the prefill, then (1, 1)
    stream_shape: tuple[int, ...]  # the residual stream inside the blocks
    positions: tuple[int, ...]  # the positions this step computed
    kv_shape: tuple[int, ...]  # one layer's keys (= values): (B, kv_heads, positions, head_dim)
    kv_layers: int  # layers holding such a pair
    kv_bytes: int  # keys + values of every layer
    kv_layout: tuple[str, ...]  # every layer's key shape, as ranges: "layers 0–29: (1, 3, 6, 64)"
    token: TopToken  # the chosen token, with its probability under the model (temperature 1)
    sample_prob: float  # its probability under the sampling distribution
    alternatives: tuple[TopToken, ...]  # the model's most probable tokens at this step
    seconds: float
    layers: tuple[LayerStats, ...]  # per-layer statistics (--layers), else empty
    final_norm: FinalNormStats | None
    first_nonfinite: str | None
    decomposition: Decomposition | None = None  # with --layers


@dataclass(frozen=True)
class Generation:
    prompt: str
    model: ModelInfo
    tokens: tuple[Token, ...]  # the prompt's tokens
    strategy: str  # "greedy" or e.g. "temperature 0.8, top-p 0.9"
    temperature: float
    top_k: int | None
    top_p: float
    seed: int
    max_new_tokens: int
    steps: tuple[GenStep, ...]
    generated: tuple[Token, ...]  # the new tokens, positions continuing the prompt's
    text: str  # the new tokens decoded
    stop_reason: str  # "eos" or "max_new_tokens"
    prefill_seconds: float
    decode_seconds: float
    decode_tokens_per_s: float | None
    notes: tuple[str, ...]
    kind: str = "generation"
    schema_version: str = SCHEMA_VERSION


# the results of attribute, diff and patch live beside this file; one namespace for the schema
from .results_analysis import (Attribution, Contribution, DiffSide, LayerAttribution,  # noqa: E402
                               LayerDiff, PatchCell, PatchResult, TokenDiff, TraceDiff)

__all__ = ["Attribution", "Contribution", "DiffSide", "LayerAttribution", "LayerDiff",
           "PatchCell", "PatchResult", "TokenDiff", "TraceDiff"]
