"""The result of `fptrace models`."""

from __future__ import annotations

from fptrace.results import SCHEMA_VERSION, result


@result
class ModelEntry:
    """One built-in model."""

    alias: str
    """The `--model` name."""
    family: str
    """The architecture family."""
    n_layers: int
    """Number of blocks."""
    d_model: int
    """Width of the residual stream."""
    n_heads: int
    """Query heads."""
    n_kv_heads: int
    """Key/value heads."""
    vocab_size: int
    """Vocabulary size."""
    context_length: int | None
    """Longest sequence, or null."""
    tokenizer: str | None
    """The offline tokenizer available, or null."""
    weights: str
    """Where weights are available on this machine."""
    hub_id: str | None
    """The Hugging Face repository of the config."""
    description: str
    """What the model is."""
    source: str
    """Where the stored config comes from."""


@result
class ModelList:
    """`fptrace models --json`: the built-in models."""

    models: tuple[ModelEntry, ...]
    """One entry per built-in alias."""
    kind: str = "models"
    schema_version: str = SCHEMA_VERSION
