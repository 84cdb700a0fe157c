"""fptrace: trace one forward pass of a transformer language model, block by block.

    from fptrace import load_model, trace
    lm = load_model()                      # the bundled SmolLM2-135M-Instruct
    t = trace(lm, "The capital of France is")
    t.top_k[0].text                        # ' Paris'

Importing fptrace does not import torch: each function of the API below is the core function
itself (its real signature and docstring, for editors and `help()`), imported on first use.
"""

from __future__ import annotations

from fptrace import allocation as _allocation
from fptrace import interrupt as _interrupt

_interrupt.starting()  # first of all, and only for the `fptrace` command: Ctrl-C while it starts
_allocation.starting()  # and, before numpy is imported, numpy's huge-page advice off

from typing import TYPE_CHECKING, Any

from fptrace.errors import FptraceError

__version__ = "0.1.0"

# The public API is the import block below, one line a name: editors and type checkers read it
# as it is, and at run time each name is imported from there on first use (__getattr__), so
# `import fptrace` (and the command line) stays free of torch.
if TYPE_CHECKING:
    from fptrace.addresses import Block, Expert, Head, Position, Selection, Site
    from fptrace.commands.ablate.core import ablate
    from fptrace.commands.attribute.core import attribute
    from fptrace.commands.attribute.qk import attribute_qk
    from fptrace.commands.diff.core import diff
    from fptrace.commands.diff.deep import deep_diff
    from fptrace.commands.explain.core import explain
    from fptrace.commands.explain.result import Explanation
    from fptrace.commands.features.core import features
    from fptrace.commands.generate.core import generate
    from fptrace.commands.graph.core import graph
    from fptrace.commands.patch.core import patch
    from fptrace.commands.shapes.core import shape_report as shapes
    from fptrace.commands.stats.core import activation_stats as stats
    from fptrace.commands.steer.core import steer
    from fptrace.commands.steer.vectors import steering_vector
    from fptrace.commands.tokens.core import tokens
    from fptrace.core.trace import run_trace as trace
    from fptrace.core.trace import run_traces as trace_many
    from fptrace.models.loading import load_model
    from fptrace.points import Point
    from fptrace.render.json import to_json
    from fptrace.results import (
        SCHEMA_VERSION,
        FinalNormStats,
        LayerStats,
        ModelInfo,
        ShapeStep,
        Token,
        TopToken,
        Trace,
    )


def api() -> dict[str, tuple[str, str]]:
    """The public names: name -> (module, attribute), read from the TYPE_CHECKING block above."""
    import ast
    import pathlib

    tree = ast.parse(pathlib.Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and getattr(node.test, "id", None) == "TYPE_CHECKING")
    return {alias.asname or alias.name: (node.module, alias.name)
            for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}


def __getattr__(name: str) -> Any:
    """Import an API name on first use (PEP 562) and keep it on the package."""
    if name == "__all__":
        return ["FptraceError", "__version__", *api()]
    names = api()
    if name not in names:
        raise AttributeError(f"module 'fptrace' has no attribute {name!r}")
    import importlib

    module, attribute = names[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(api()))
