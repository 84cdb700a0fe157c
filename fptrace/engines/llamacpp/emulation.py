"""`diff --engine-b llama.cpp --emulate STEPS`: llama.cpp's numerics put on the transformers side,
one step at a time, to measure how much of the gap between the engines each one explains.

The numerics are engines/llamacpp/emulate.py's; this module attaches them to a loaded model:
- `act-q8`: a hook after every linear module whose GGUF weight is quantized replaces its output
  by the product llama.cpp computes (its input quantized to the weight type's 8-bit blocks),
  and one after each MoE block's experts module each chosen expert's three products;
  the hooks are prepended, so that every other hook sees the changed output, and they read the
  module's unchanged input, so that a hook on that input (diff --deep's z and mlp_act) sees what
  llama.cpp's graph names there (its quantization happens inside the product);
- `kv` and `attn`: an attention function registered with transformers (AttentionInterface) and
  set as the model's attention implementation while the pass runs, restored after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from fptrace.core.hooks import Hook, hooked
from fptrace.engines.llamacpp import emulate as E
from fptrace.errors import BadInput, param
from fptrace.models.loading import LoadedModel

if TYPE_CHECKING:
    import torch

PREFIX = "fptrace-llamacpp"
# in the registered name ("flash" in it would make transformers look for a flash-attn package)
KERNEL_NAMES = {"flash": "online", "plain": "plain", None: "f32"}


def product_hooks(lm: LoadedModel, types: dict[str, str], names: Any) -> list[Hook]:
    """A hook on every linear module of the blocks and on the LM head whose GGUF weight is
    quantized (or f16/bf16): its output becomes llama.cpp's product."""
    hooks = []
    for layer, blk in enumerate(lm.parts.blocks):
        for path, base in names.weights.items():
            kind = types.get(f"blk.{layer}.{base}.weight")
            if kind is not None and E.VEC_DOT.get(kind) is not None:
                hooks.append(_product_hook(blk.get_submodule(path), kind))
        for path, bases in names.experts.items():
            kinds = tuple(types.get(f"blk.{layer}.{base}.weight") for base in bases)
            if any(k is not None and E.VEC_DOT.get(k) is not None for k in kinds):
                hooks.append(_experts_hook(blk.get_submodule(path), kinds))
    head = next((types[f"{n}.weight"] for n in names.heads if f"{n}.weight" in types), None)
    if head is not None and E.VEC_DOT.get(head) is not None:
        hooks.append(_product_hook(lm.parts.lm_head, head))
    return hooks


def _experts_hook(module: Any, kinds: tuple) -> Hook:
    """A hook after transformers' experts module of one MoE block (gate_up_proj (E, 2·I, d) and
    down_proj (E, d, I) stacked; called with the tokens (N, d), the experts each token chose
    (N, k) and their weights (N, k)): its output becomes llama.cpp's, each chosen expert's three
    products computed with its input quantized for that weight's type (`kinds`: the GGUF types
    of gate, up, down; llama.cpp's mul_mat_id quantizes as mul_mat does), the expert's output
    times its weight, added up over the chosen experts."""
    import torch

    gate_up, down = module.gate_up_proj.detach(), module.down_proj.detach()
    half = gate_up.shape[1] // 2
    weights = (gate_up[:, :half], gate_up[:, half:], down)
    minimums = tuple(E.block_minimums(w.reshape(-1, w.shape[-1])).reshape(*w.shape[:2], -1)
                     if E.VEC_DOT.get(k) == "Q8_1" else None
                     for w, k in zip(weights, kinds, strict=True))

    def product(x: torch.Tensor, i: int, e: int) -> torch.Tensor:
        w = weights[i][e].float()
        if E.VEC_DOT.get(kinds[i]) is None:  # float32 (or a type with no emulation)
            return torch.nn.functional.linear(x, w)
        m = minimums[i]
        return E.quantized_product(x, w, None, kinds[i], None if m is None else m[e])

    def after(m: Any, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
        x, chosen, weight = (*args, *kwargs.values())[:3]
        x = x.float()
        out = torch.zeros_like(x)
        for e in torch.unique(chosen).tolist():
            if not 0 <= e < weights[0].shape[0]:
                continue
            token, slot = torch.where(chosen == e)
            rows = x[token]
            act = m.act_fn(product(rows, 0, e)) * product(rows, 1, e)
            out.index_add_(0, token, product(act, 2, e) * weight[token, slot, None].float())
        return out.to(output.dtype)

    return Hook.after(module, after, kwargs=True)


def _product_hook(module: Any, kind: str) -> Hook:
    minimums = None
    if E.VEC_DOT[kind] == "Q8_1":  # Q4_1, Q5_1: each weight block's minimum m (see emulate.py)
        minimums = E.block_minimums(module.weight.detach())

    def after(m: Any, args: tuple, output: Any) -> Any:
        x = args[0]
        return E.quantized_product(x.float(), m.weight.float(), None if m.bias is None
                                   else m.bias.float(), kind, minimums).to(output.dtype)

    return Hook.after(module, after)


def norm_hooks(lm: LoadedModel) -> list[Hook]:
    """A hook on every RMSNorm of the model (the blocks' norms and the final one): its output
    becomes ggml's."""
    hooks = []
    for module in lm.model.modules():
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        if type(module).__name__.endswith("RMSNorm") and eps is not None and \
                getattr(module, "weight", None) is not None:
            hooks.append(Hook.after(module, _norm_hook(float(eps))))
    return hooks


def _norm_hook(eps: float):
    def after(m: Any, args: tuple, output: Any) -> Any:
        return E.rms_norm(args[0], m.weight, eps).to(output.dtype)
    return after


def attention_name(cache: str, kv: bool, kernel: str | None, q_scaled: bool = False) -> str:
    """Register the attention function of these settings with transformers; its name."""
    from transformers import AttentionInterface

    name = f"{PREFIX}-{cache}-{'kv' if kv else 'f32'}-{KERNEL_NAMES[kernel]}" + \
        ("-qscaled" if q_scaled else "")
    AttentionInterface.register(name, E.attention_function(cache, kv, kernel, q_scaled))
    return name


@contextlib.contextmanager
def emulating(lm: LoadedModel, path: str, steps: Sequence[str], *, cache: str,
              flash: bool) -> Iterator[str | None]:
    """The transformers model of `lm` computing with llama.cpp's numerics `steps` while inside
    (the GGUF at `path` gives each weight's type); yields the attention implementation set
    (None when neither kv nor attn is on)."""
    if not steps:
        yield None
        return
    names = lm.parts.family.llamacpp_names
    if names is not None and names.no_emulation:
        raise BadInput(f"{param('emulate')} does not cover the {lm.parts.family.name} family: "
                       f"{names.no_emulation}")
    if names is None or not names.weights:
        raise BadInput(f"{param('emulate')}: the {lm.parts.family.name} family does not map its "
                       f"weights "
                       "to llama.cpp's names")
    hooks = product_hooks(lm, E.weight_types(path), names) if "act-q8" in steps else []
    if "norm" in steps:
        hooks += norm_hooks(lm)
    name = None
    before = None
    if "kv" in steps or "attn" in steps:
        name = attention_name(cache, "kv" in steps,
                              ("flash" if flash else "plain") if "attn" in steps else None,
                              names.q_scaled)
        before = getattr(lm.config, "_attn_implementation", None)
        lm.model.set_attn_implementation(name)
    try:
        with hooked(hooks, prepend=True):
            yield name
    finally:
        if name is not None and before is not None:
            lm.model.set_attn_implementation(before)


__all__ = ["attention_name", "emulating", "norm_hooks", "product_hooks"]
