"""The modules of one loaded model, found through its Family (or, for a model type the registry
does not know, by a generic search whose every guess is said), and the config's dimensions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fptrace.errors import UnsupportedModel
from fptrace.families import Family, family_for_config, supported_types
from fptrace.families.kinds import MlpKind, NormKind, PositionKind

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel


@dataclass(frozen=True)
class Dims:
    """The config's dimensions, normalised once: every command reads them from here."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_mlp: int | None  # None when the config does not say (a model the registry does not know)
    vocab_size: int
    context_length: int | None


def dims(config: PretrainedConfig, family: Family | None = None) -> Dims:
    family = family or family_for_config(config)
    d = int(config.hidden_size)
    h = int(config.num_attention_heads)
    d_mlp = family.d_mlp(config) if family is not None else \
        getattr(config, "intermediate_size", None)
    return Dims(
        n_layers=int(config.num_hidden_layers), d_model=d, n_heads=h,
        n_kv_heads=int(getattr(config, "num_key_value_heads", None) or h),
        head_dim=int(getattr(config, family.head_dim_attr) if family and family.head_dim_attr
                     else getattr(config, "head_dim", None) or d // h),
        d_mlp=int(d_mlp) if d_mlp else None, vocab_size=int(config.vocab_size),
        context_length=getattr(config, "max_position_embeddings", None))


@dataclass(frozen=True)
class ModelParts:
    """The modules of one loaded model, resolved through its Family."""

    family: Family
    blocks: list
    attns: list  # the attention modules (weights)
    mlps: list  # the MLP modules (weights)
    attn_adds: list  # per block: the module whose output the stream receives from attention
    mlp_adds: list  # per block: the module whose output the stream receives from the MLP
    final_norm: Any
    lm_head: Any
    embed: Any
    parallel_residual: bool
    final_softcap: float | None = None  # cap·tanh(logits / cap) after the LM head
    known: tuple[str, ...] = ()  # for the generic fallback: the facts inferred, and from what
    unknown: tuple[str, ...] = ()  # ... and the facts it could not establish

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The model's own final projection of residual-stream vectors (..., d) -> logits
        (..., V): final norm, LM head, and the final softcap when the family has one. The logit
        lens, explain and every later feature use this one function."""
        return self.head(self.final_norm(x))

    def head(self, normed: torch.Tensor) -> Any:
        """The LM head and the final softcap (when the family has one) on vectors the final
        norm has already normalized: what llama.cpp's `result_output` is of its `result_norm`."""
        import torch

        logits = self.lm_head(normed)
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits


def output_projection(attn: nn.Module, names: tuple[str, ...]
                      ) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor | None]]:
    """The attention output projection W_O of one attention module (the first of the family's
    leaf names it has), and its weights as (W (out=d, in=nh·hd) float32, bias (d,) or None).
    Its input is the heads side by side, head h in columns h·hd .. (h+1)·hd."""
    for name in names:
        proj = getattr(attn, name, None)
        if proj is not None:
            w = proj.weight.float()
            if type(proj).__name__ == "Conv1D":  # GPT-2 stores (in, out)
                w = w.T
            bias = getattr(proj, "bias", None)
            return proj, (w, None if bias is None else bias.float())
    raise UnsupportedModel("cannot find the attention output projection W_O "
                           f"({', '.join(names)}) to split attention per head")


def _child(block: nn.Module, path: str | None, default: nn.Module) -> nn.Module:
    return default if path is None else block.get_submodule(path)


def resolve_parts(model: Any) -> ModelParts:
    """Find blocks, attention, MLP, final norm and LM head of a causal LM.

    Registered families come from their Family; other models fall back to a generic search:
    the ModuleList whose length equals config.num_hidden_layers, with every inferred fact said
    (ModelParts.known / unknown) and the attention/MLP split checked on every trace."""
    config = model.config
    family = family_for_config(config)
    if family is None:
        return _generic_parts(model)
    blocks = list(model.get_submodule(family.blocks))
    attns = [b.get_submodule(family.attn) for b in blocks]
    mlps = [b.get_submodule(family.mlp) for b in blocks]
    return ModelParts(
        family=family, blocks=blocks, attns=attns, mlps=mlps,
        attn_adds=[_child(b, family.attn_added, a) for b, a in zip(blocks, attns)],
        mlp_adds=[_child(b, family.mlp_added, m) for b, m in zip(blocks, mlps)],
        final_norm=model.get_submodule(family.final_norm),
        lm_head=model.get_submodule(family.lm_head),
        embed=model.get_submodule(family.embed),
        parallel_residual=family.uses_parallel_residual(config),
        final_softcap=family.softcap(config, "final"))


# Names tried, in order, when a model type has no family.
_GENERIC_ATTN = ("self_attn", "attn", "attention", "self_attention")
_GENERIC_MLP = ("mlp", "feed_forward", "ffn")
_GENERIC_NORM = ("model.norm", "transformer.ln_f", "model.final_layernorm", "transformer.norm_f",
                 "gpt_neox.final_layer_norm", "model.decoder.final_layer_norm")


def _unsupported(config: PretrainedConfig, what: str) -> UnsupportedModel:
    return UnsupportedModel(f"cannot find the {what} of model type {config.model_type!r}; "
                            "supported families: " + ", ".join(supported_types()))


def _generic_parts(model: PreTrainedModel) -> ModelParts:
    import torch.nn as nn

    config = model.config
    n_layers = getattr(config, "num_hidden_layers", None)
    lists = [(name, m) for name, m in model.named_modules()
             if isinstance(m, nn.ModuleList) and n_layers and len(m) == n_layers]
    if not lists:
        raise _unsupported(config, "blocks")
    blocks_path, block_list = lists[0]
    blocks = list(block_list)

    def child(block: nn.Module, names: tuple[str, ...], what: str) -> tuple[str, nn.Module]:
        for n in names:
            m = getattr(block, n, None)
            if m is not None:
                return n, m
        raise _unsupported(config, f"{what} of the blocks")

    attn_name, _ = child(blocks[0], _GENERIC_ATTN, "attention")
    mlp_name, _ = child(blocks[0], _GENERIC_MLP, "MLP")
    attns = [child(b, _GENERIC_ATTN, "attention")[1] for b in blocks]
    mlps = [child(b, _GENERIC_MLP, "MLP")[1] for b in blocks]
    final_name = next((p for p in _GENERIC_NORM if _get(model, p) is not None), None)
    lm_head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if final_name is None or lm_head is None or embed is None:
        raise _unsupported(config, "final norm, LM head or embedding")
    norm_type, norm_fact = _infer_norm(blocks[0])
    mlp_type, mlp_fact = _infer_mlp(mlps[0], config)
    positions, pos_fact = _infer_positions(model, config)
    known = [f for f in (norm_fact, mlp_fact, pos_fact) if f]
    unknown = ["what attention and the MLP add to the stream (taken as the outputs of "
               f"{attn_name} and {mlp_name}, checked on every trace)",
               "embedding scale and final-logit softcap (none assumed; the logit lens is "
               "final norm + LM head)"]
    unknown += [f"{what} (no rule matched)" for what, v in
                (("norm type", norm_type), ("MLP kind", mlp_type), ("position scheme", positions))
                if v == "unknown"]
    generic = Family(
        name=f"generic:{config.model_type}", title=config.model_type,
        model_types=(config.model_type,), blocks=blocks_path, embed="", final_norm=final_name,
        lm_head="", attn=attn_name, mlp=mlp_name, norm_type=NormKind(norm_type),
        mlp_type=MlpKind(mlp_type), positions=PositionKind(positions), tiny={})
    return ModelParts(
        family=generic, blocks=blocks, attns=attns, mlps=mlps, attn_adds=attns, mlp_adds=mlps,
        final_norm=model.get_submodule(final_name), lm_head=lm_head, embed=embed,
        parallel_residual=bool(getattr(config, "use_parallel_residual", False)),
        known=tuple(known), unknown=tuple(unknown))


def _get(model: nn.Module, path: str) -> nn.Module | None:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def _infer_norm(block: nn.Module) -> tuple[str, str | None]:
    for name, m in block.named_modules():
        cls = type(m).__name__
        if "RMSNorm" in cls:
            return "rmsnorm", f"norm: rmsnorm (class {cls})"
        if "LayerNorm" in cls:
            return "layernorm", f"norm: layernorm (class {cls})"
    return "unknown", None


def _infer_mlp(mlp: nn.Module, config: PretrainedConfig) -> tuple[str, str | None]:
    act = getattr(config, "hidden_act", None) or getattr(config, "activation_function", None)
    gated = any(hasattr(mlp, n) for n in ("gate_proj", "gate_up_proj", "w3"))
    if gated and act in ("silu", "swish"):
        return "swiglu", f"MLP: swiglu (a gate projection and hidden_act={act!r})"
    if gated and act and "gelu" in act:
        return "geglu", f"MLP: geglu (a gate projection and hidden_act={act!r})"
    if not gated and act and "gelu" in act:
        return "gelu", f"MLP: gelu (no gate projection, activation {act!r})"
    return "unknown", None


def _infer_positions(model: nn.Module, config: PretrainedConfig) -> tuple[str, str | None]:
    if getattr(config, "rope_parameters", None) or getattr(config, "rope_theta", None):
        return "rope", "positions: rope (the config has RoPE parameters)"
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    if names & {"wpe", "embed_positions", "position_embeddings"}:
        return "learned", "positions: learned (a position-embedding module)"
    return "unknown", None


__all__ = ["Dims", "ModelParts", "dims", "output_projection", "resolve_parts"]
