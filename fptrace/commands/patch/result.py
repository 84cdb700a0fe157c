"""The result of `fptrace patch`."""

from __future__ import annotations

from fptrace.results import SCHEMA_VERSION, ModelInfo, Token, TopToken, result


@result
class PatchCell:
    """One cell of the causal-tracing grid."""

    layer: int
    """The block (the centre of the window with attn/mlp)."""
    position: int
    """The token position."""
    prob: float
    """The target's probability with this state restored."""


@result
class PatchResult:
    """`fptrace patch --json`: causal tracing, the target's probability with one state restored from
    the clean run, for every layer and position."""

    prompt: str
    """The clean prompt."""
    model: ModelInfo
    """The model that was run."""
    tokens: tuple[Token, ...]
    """The clean prompt's tokens (the grid's columns)."""
    corrupt_tokens: tuple[Token, ...]
    """The corrupted run's tokens (the same ids, with --noise)."""
    corruption: str
    """`noise` (Gaussian noise on the subject's embeddings) or `prompt` (`--corrupt`)."""
    subject: str | None
    """`--noise`: the subject whose tokens were noised; else null."""
    subject_positions: tuple[int, ...]
    """The positions the noise was added at."""
    noise_std: float | None
    """The noise's standard deviation (`--noise-scale` × the embedding's); null with `--corrupt`."""
    noise_scale: float
    """`--noise-scale`."""
    seed: int
    """The noise's seed (`--seed`)."""
    what: str
    """What a cell restores: `resid` (the block's output stream), `attn` or `mlp` (what they added)."""
    window: int
    """With attn/mlp: how many layers around the row's layer are restored."""
    target: TopToken
    """The token whose probability is measured, as the clean run ranks it."""
    p_clean: float
    """Its probability in the clean run."""
    p_corrupt: float
    """Its probability in the corrupted run, nothing restored."""
    grid: tuple[tuple[float, ...], ...]
    """Layers × positions: its probability with that state restored."""
    best: tuple[PatchCell, ...]
    """The cells of highest probability, best first."""
    forward_passes: int
    """Forward passes run: the clean one, the corrupted one and the batches of patched runs."""
    notes: tuple[str, ...]
    """Sentences a reader should see with the numbers (random weights, truncation, ...)."""
    kind: str = "patch"
    schema_version: str = SCHEMA_VERSION
