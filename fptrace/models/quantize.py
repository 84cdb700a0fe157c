"""Weight-only quantization on load, through transformers' own integration: `TorchAoConfig` with
torchao's weight-only schemes, which run on CPU and CUDA.

- int8: `Int8WeightOnlyConfig`, one scale per output row;
- int4: `IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))`, one scale per
  group of 32 weights of a row (torchao's CPU-capable int4; its `Int4WeightOnlyConfig` needs
  CUDA kernels).

The linear layers of the blocks are quantized; transformers leaves the embeddings and the LM head
as they are. Activations keep the model's dtype: each layer dequantizes its weights as it runs.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from fptrace.errors import BadInput, param

QUANTIZATIONS = ("int8", "int4")
INT4_GROUP = 32
INSTALL = 'pip install "torchao>=0.15" (or pip install "fptrace[quant]")'


def quiet_torchao(needed: bool = False) -> None:
    """torchao logs, on import, the CUDA extensions it cannot load on a CPU machine, and torch's
    pytree complains about its enums; neither matters to fptrace. And transformers imports
    torchao whenever it is installed (seconds of a command's start), though only a quantized
    load uses it: so until one is `needed`, transformers is told that torchao is not there.
    Runs before any model is loaded."""
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if needed:
        show_torchao()
    elif "torchao" not in sys.modules:
        hide_torchao()


def _absent(*args: Any, **kwargs: Any) -> bool:
    return False


_real_check: dict[str, Any] = {}


def hide_torchao() -> None:
    """transformers' `is_torchao_available` answers False (its modules import torchao at their
    own import only where it answers True)."""
    from transformers.utils import import_utils

    if "check" in _real_check:
        return
    _real_check["check"] = import_utils.is_torchao_available
    for module in transformers_modules():
        if getattr(module, "is_torchao_available", None) is _real_check["check"]:
            module.is_torchao_available = _absent


def show_torchao() -> None:
    """Undo hide_torchao in every transformers module that took the stand-in (a quantized load
    in a process, a resident server, that hid it before)."""
    real = _real_check.pop("check", None)
    if real is None:
        return
    for module in transformers_modules():
        if getattr(module, "is_torchao_available", None) is _absent:
            module.is_torchao_available = real


def transformers_modules() -> list[Any]:
    return [m for name, m in list(sys.modules.items())
            if m is not None and (name == "transformers" or name.startswith("transformers."))]


def check_quantization(kind: str, device: Any, config: Any = None, *,
                       random_weights: bool = False, ranks: int = 1) -> None:
    """Refuse, before anything is read, a quantization this load cannot run: an unknown scheme,
    random weights (built in memory, not loaded), tensor parallelism, a device other than CPU or
    CUDA, or (int4) a linear layer whose width is not a multiple of the group size."""
    if kind not in QUANTIZATIONS:
        raise BadInput(f"quantization {kind!r}: choose int8 or int4 (torchao weight-only)")
    if random_weights:
        raise BadInput(f"{kind} quantization applies to weights loaded from a checkpoint; random "
                       f"weights are built in memory (drop {param('random_weights')} or the "
                       f"quantization)")
    if ranks > 1:
        raise BadInput(f"{kind} quantization and tensor parallelism do not go together here; "
                       "quantize in one process")
    dev = getattr(device, "type", str(device))
    if dev not in ("cpu", "cuda"):
        raise BadInput(f"torchao's weight-only {kind} runs on CPU and CUDA, not on {dev}; pass "
                       f"{param('device')} cpu")
    if kind == "int4" and config is not None:
        from fptrace.families.parts import dims

        dm = dims(config)
        widths = {"d_model": dm.d_model, "heads × head_dim": dm.n_heads * dm.head_dim,
                  "d_mlp": dm.d_mlp or INT4_GROUP}
        bad = {k: w for k, w in widths.items() if w % INT4_GROUP}
        if bad:
            name, width = next(iter(bad.items()))
            raise BadInput(f"int4 quantizes each row in groups of {INT4_GROUP} weights, and this "
                           f"model has a linear layer {width} wide ({name}); use int8")


def quantization_config(kind: str) -> Any:
    """The TorchAoConfig of a scheme, or BadInput with the one line that installs torchao."""
    quiet_torchao(needed=True)
    try:
        import torch
        from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig, PerGroup
        from transformers import TorchAoConfig
    except ImportError:
        raise BadInput(f"{kind} quantization needs torchao, which is not installed: "
                       f"{INSTALL}") from None
    if kind == "int8":
        scheme = Int8WeightOnlyConfig()
    else:
        scheme = IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(INT4_GROUP))
    try:
        return TorchAoConfig(scheme)
    except (ValueError, ImportError) as e:  # e.g. a torchao too old for this transformers
        raise BadInput(f"{kind} quantization: {str(e).splitlines()[0][:200]}; {INSTALL}") \
            from None


def quantized_layers(blocks: Any) -> tuple[int, list[str]]:
    """(how many of the blocks' linear weights torchao replaced by quantized tensors, the kinds
    of linear layer it left as they were). transformers' GPT-2 keeps its projections in
    `Conv1D` modules, which torchao's weight-only schemes do not touch."""
    import torch

    done, left = 0, []
    for block in blocks:
        for name, m in block.named_modules():
            w = getattr(m, "weight", None)
            if w is None or not (isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"):
                continue
            if type(w) in (torch.nn.Parameter, torch.Tensor):
                left.append(f"{name} ({type(m).__name__})")
            else:
                done += 1
    return done, left


def check_quantized(kind: str, model_name: str, blocks: Any) -> int:
    """The number of weights quantized on load; none at all is refused, naming the layers."""
    done, left = quantized_layers(blocks)
    if done == 0:
        names = sorted(set(left))
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise BadInput(f"{kind} quantization would change nothing: torchao quantized none of "
                       f"{model_name}'s linear weights (its blocks' layers: "
                       f"{shown or 'none found'})")
    return done


def describe(kind: str | None) -> str | None:
    """How a quantized model is named in headers: `int8 weight-only`."""
    return None if kind is None else f"{kind} weight-only"


__all__ = [
    "INSTALL",
    "QUANTIZATIONS",
    "check_quantization",
    "check_quantized",
    "describe",
    "hide_torchao",
    "quantization_config",
    "quantized_layers",
    "quiet_torchao",
    "show_torchao",
]
