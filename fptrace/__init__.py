"""fptrace: trace one forward pass of a transformer language model, block by block.

    from fptrace import load_model, trace
    lm = load_model()                      # the bundled SmolLM2-135M-Instruct
    t = trace(lm, "The capital of France is")
    t.top_k[0].text                        # ' Paris'

Importing fptrace does not import torch; the functions below import it when called.
"""

from __future__ import annotations

from typing import Any

from .errors import FptraceError
from .results import (SCHEMA_VERSION, Explanation, FinalNormStats, LayerStats, ModelInfo,
                      ShapeStep, Token, TopToken, Trace)

__version__ = "0.1.0"


def load_model(name: str = "smollm2-135m", **kwargs: Any) -> Any:
    """Load a model by alias, .gguf file, folder or hub id; see fptrace.models.loading."""
    from .models.loading import load_model as _load

    return _load(name, **kwargs)


def trace(lm: Any, prompt: Any, **kwargs: Any) -> Trace:
    """Trace one prompt (text or token ids) through a loaded model."""
    from .tracer import run_trace

    return run_trace(lm, prompt, **kwargs)


def trace_many(lm: Any, prompts: Any, **kwargs: Any) -> list[Trace]:
    """Trace several prompts in one padded forward pass."""
    from .tracer import run_traces

    return run_traces(lm, prompts, **kwargs)


def explain(lm: Any, prompt: Any, **kwargs: Any) -> Explanation:
    """Recompute one block step by step and check it against the model (see fptrace.walkthrough)."""
    from .walkthrough import explain as _explain

    return _explain(lm, prompt, **kwargs)


def attribute(lm: Any, prompt: Any, **kwargs: Any) -> Any:
    """Direct logit attribution that sums to the model's logit (see fptrace.attribution)."""
    from .attribution import attribute as _attribute

    return _attribute(lm, prompt, **kwargs)


def patch(lm: Any, prompt: Any, **kwargs: Any) -> Any:
    """Causal tracing: the layers × positions grid of restored probability (see fptrace.patching)."""
    from .patching import patch as _patch

    return _patch(lm, prompt, **kwargs)


def diff(a: Any, b: Any, **kwargs: Any) -> Any:
    """Compare two traces (Trace objects or `run --json` dicts) layer by layer."""
    from .tracediff import diff_traces
    from .schema import to_dict

    return diff_traces(*(t if isinstance(t, dict) else to_dict(t) for t in (a, b)), **kwargs)


__all__ = ["load_model", "trace", "trace_many", "explain", "attribute", "patch", "diff", "Explanation", "Trace", "LayerStats", "ModelInfo", "Token",
           "TopToken", "ShapeStep", "FinalNormStats", "FptraceError", "SCHEMA_VERSION",
           "__version__"]
