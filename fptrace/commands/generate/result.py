"""The result of `fptrace generate`."""

from __future__ import annotations

from fptrace.results import (
    SCHEMA_VERSION,
    Decomposition,
    FinalNormStats,
    LayerStats,
    ModelInfo,
    Token,
    TopToken,
    result,
)


@result
class GenStep:
    """One forward pass of generation: the prefill (index 0) or one decode step."""

    index: int
    """0 for the prefill, then 1, 2, ..."""
    phase: str
    """`prefill` or `decode`."""
    input_shape: tuple[int, ...]
    """Shape of the step's input ids: (1, T) for the prefill, then (1, 1)."""
    stream_shape: tuple[int, ...]
    """Shape of the residual stream inside the blocks during the step."""
    positions: tuple[int, ...]
    """The positions this step computed."""
    kv_shape: tuple[int, ...]
    """Shape of one layer's cached keys (and values) after the step: (batch, key/value heads,
    positions, head_dim)."""
    kv_layers: int
    """Layers holding cached keys and values."""
    kv_bytes: int
    """Bytes of every cached key and value after the step."""
    kv_layout: tuple[str, ...]
    """Every layer's cached key shape, as ranges of layers with the same shape (`layers 0–29: (1, 3,
    6, 64)`); values have the same shapes."""
    token: TopToken
    """The chosen token; its `prob` and `rank` are under the model's own distribution (temperature
    1)."""
    sample_prob: float
    """The chosen token's probability under the sampling distribution (the model's after
    temperature, top-k and top-p, as `Generation.strategy` says; 1 when greedy), the one it
    was drawn from."""
    alternatives: tuple[TopToken, ...]
    """The model's most probable tokens at this step (`--alternatives`), each `prob` under the
    model's own distribution (temperature 1), like `token.prob`."""
    seconds: float
    """Wall time of the step: forward pass and choice."""
    layers: tuple[LayerStats, ...]
    """Per-layer statistics at the step's last position (`--layers`), else empty; `resid_norm_mean`
    is over the positions this step computed."""
    final_norm: FinalNormStats | None
    """The final norm's output at the last position (`--layers`), else null."""
    first_nonfinite: str | None
    """Where NaN or Inf first appeared in this step, or null."""
    decomposition: Decomposition | None = None
    """With `--layers`: the attn + mlp = Δ check of this step (see Decomposition); null without
    `--layers`."""


@result
class Generation:
    """`fptrace generate --json`: generation as a sequence of forward passes, with the KV cache after
    each."""

    prompt: str
    """The prompt as given."""
    model: ModelInfo
    """The model that was run."""
    tokens: tuple[Token, ...]
    """The prompt's tokens."""
    strategy: str
    """How tokens were chosen: `greedy`, or the sampling settings in words."""
    temperature: float
    """`--temperature` (0 is greedy)."""
    top_k: int | None
    """`--top-k`, or null when off."""
    top_p: float
    """`--top-p` (1 is off)."""
    seed: int
    """`--seed` of the draws (step i draws with seed × 1000003 + i)."""
    max_new_tokens: int
    """`-n`."""
    steps: tuple[GenStep, ...]
    """One entry per forward pass, the prefill first."""
    generated: tuple[Token, ...]
    """The new tokens, with positions continuing the prompt's."""
    text: str
    """The new tokens decoded."""
    stop_reason: str
    """`eos` (an end-of-sequence token was chosen) or `max_new_tokens`."""
    prefill_seconds: float
    """Time of the prefill step."""
    decode_seconds: float
    """Time of all decode steps."""
    decode_tokens_per_s: float | None
    """Decode steps per second, or null with no decode step."""
    notes: tuple[str, ...]
    """Sentences a reader should see with the numbers (random weights, truncation, ...)."""
    kind: str = "generation"
    schema_version: str = SCHEMA_VERSION
