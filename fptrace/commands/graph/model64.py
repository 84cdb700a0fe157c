"""The model in float64, and the values the graph must reproduce: one real forward pass.

The graph is computed on a float64 copy of the model, so that its sums are exact to float64's
rounding. Its norms are computed in float64 too (transformers' RMSNorm casts to float32 inside
whatever the weights' dtype). The real pass reads each neuron's activation where the down
projection takes it and each logit from the LM head's output (before any final softcap); the
copy's logits are checked against the model's own forward pass in its own dtype. In a mixture of
experts' block, each chosen expert's neuron act(gate) · up, recomputed from the MLP's input and
the router's own choice, and the router's choice itself (experts.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fptrace.commands.graph.experts import layouts, real_hooks
from fptrace.commands.graph.freezing import MlpSites, float64_norms
from fptrace.commands.graph.transcoders import latents_hook
from fptrace.core.hooks import Hook, first_output, hooked
from fptrace.errors import BadInput, param
from fptrace.families.parts import ModelParts, resolve_parts
from fptrace.models.loading import LoadedModel

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch import nn

    from fptrace.commands.graph.transcoders import TranscoderSet


@dataclass(frozen=True)
class Real:
    """What the float64 model computed on the prompt."""

    acts: torch.Tensor  # (L, T, m) every neuron's activation (a narrower block's padded with 0)
    logits: torch.Tensor  # (Q, V) the LM head's output at the query positions (before softcap)
    probs: torch.Tensor  # (Q, V) the probabilities (after any softcap), float64
    own: torch.Tensor  # (Q, V) the model's own LM head output in its dtype, as float64
    # MoE block -> the router's choice: indices (T, k), weights (T, k) float64, and the shared
    # experts' gate (T,) or None (experts.real_hooks)
    routes: dict = field(default_factory=dict)
    # (L, T, m) True where a neuron's up pre-activation is clamped (gpt-oss's experts): its
    # activation is a constant under the freezing, a bias term of what it writes into, never
    # a node; None where no block clamps
    clamped: torch.Tensor | None = None

    @property
    def sources(self) -> torch.Tensor:
        """(L, T, m) the activations of the neurons that can be nodes (Candidates.top): acts,
        the clamped neurons' 0."""
        return self.acts if self.clamped is None else self.acts.masked_fill(self.clamped, 0.0)


def float64_copy(lm: LoadedModel) -> tuple[nn.Module, ModelParts]:
    """A float64 copy of the model (its gradients off) and its parts."""
    import torch

    return model_copy(lm, torch.float64)


def model_copy(lm: LoadedModel, dtype: torch.dtype) -> tuple[nn.Module, ModelParts]:
    """A copy of the model in `dtype` (its gradients off) and its parts: float64 for the real
    pass and the exact rows, float32 for graph(precision="float32")'s candidate rows."""
    import torch

    if lm.quantization:
        raise BadInput(f"graph needs the weights in floating point; drop {param('quantize')}")
    if lm.tensor_parallel > 1 or getattr(lm.model, "hf_device_map", None):
        raise BadInput(f"graph runs the whole model in one process: drop {param('tp')} and "
                       f"{param('device_map')}")
    # each parameter made once, in dtype, with its gradient off (a weight already in dtype:
    # the loaded model's own storage, shared, not copied); the rest of the module copied
    memo = {id(p): torch.nn.Parameter(p.detach().to(dtype), requires_grad=False)
            for p in lm.model.parameters()}
    model = copy.deepcopy(lm.model, memo).to(dtype)
    if getattr(model, "_can_set_experts_implementation", lambda: False)():
        model.set_experts_implementation("eager")  # grouped_mm takes no float64 (and the
        # float32 copy then runs the experts' loop as the float64 one does)
    return model.eval(), resolve_parts(model)


def real_pass(lm: LoadedModel, model: nn.Module, parts: ModelParts, sites: MlpSites | None,
              ids: list[int], queries: list[int], transcoders: TranscoderSet | None = None
              ) -> Real:
    """The float64 copy's activations and logits on ids, and the model's own logits; with
    `transcoders` (a TranscoderSet) the activations are its latents' on each block's MLP input
    (zeros for a block without one), every block as wide as the widest."""
    import torch

    acts: dict[int, torch.Tensor] = {}
    got: dict[str, torch.Tensor] = {}

    def keep_act(layer: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple) -> None:
            acts[layer] = args[0][0].detach().cpu().clone()  # (T, m)
        return hook

    def keep(key: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            got[key] = first_output(output)[0].detach().to(torch.float64).cpu()  # (Q, V)
        return hook

    routes: dict[int, tuple] = {}
    clamped: dict[int, torch.Tensor] = {}
    if transcoders is None:
        assert sites is not None
        experts = layouts(parts, sites.moe)
        hooks = [Hook.before(b.get_submodule(sites.down), keep_act(i))
                 for i, b in enumerate(parts.blocks) if i not in experts]
        for i, lay in experts.items():
            assert sites.moe is not None
            hooks += real_hooks(parts.mlps[i], i, sites.moe, lay, acts, routes, clamped)
    else:
        hooks = [Hook.after(parts.mlps[i], latents_hook(acts, i, tc))
                 for i, tc in sorted(transcoders.by_block.items())]
    hooks += float64_norms(model, parts)
    device = parts.embed.weight.device
    x = torch.tensor([ids], device=device)
    keep_idx = torch.tensor(queries, device=device)
    with torch.no_grad(), hooked([*hooks, Hook.after(parts.lm_head, keep("logits"))],
                                 prepend=True):
        final = model(x, use_cache=False, logits_to_keep=keep_idx).logits[0]  # (Q, V)
    with torch.inference_mode(), hooked([Hook.after(lm.parts.lm_head, keep("own"))]):
        lm.model(x.to(lm.device), use_cache=False, logits_to_keep=keep_idx.to(lm.device))
    T = len(ids)
    m = transcoders.width if transcoders is not None else max(a.shape[-1] for a in acts.values())
    acts = {i: torch.nn.functional.pad(acts[i], (0, m - acts[i].shape[-1])) if i in acts
            else torch.zeros(T, m, dtype=torch.float64) for i in range(len(parts.blocks))}
    held = None
    if clamped:
        held = torch.zeros(len(parts.blocks), T, m, dtype=torch.bool)
        for i, c in clamped.items():
            held[i, :, :c.shape[-1]] = c
    return Real(acts=torch.stack([acts[i] for i in range(len(parts.blocks))]),
                logits=got["logits"], probs=torch.softmax(final, dim=-1).cpu(), own=got["own"],
                routes=routes, clamped=held)


__all__ = ["Real", "float64_copy", "model_copy", "real_pass"]
