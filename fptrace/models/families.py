"""The one table of per-architecture facts.

Everything else in fptrace is family-agnostic: it asks this table where the blocks, norms,
attention, MLP and LM head of a model live. Adding a family is adding a row here plus a
tiny-config test in tests/test_families.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedModel


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # values of config.model_type served by this row
    blocks: str  # dotted path, from the *ForCausalLM root, to the ModuleList of blocks
    embed: str  # token embedding
    pos_embed: str | None  # learned absolute position embedding, if any
    final_norm: str
    lm_head: str
    attn: str  # attention module, relative to a block; its output[0] is what is added
    mlp: str  # MLP module, relative to a block; its output is what is added
    norm_type: str  # "layernorm" | "rmsnorm"
    mlp_type: str  # "gelu" | "swiglu"
    positions: str  # "learned" | "rope"
    parallel_residual: bool = False  # attn and MLP both read resid_pre (GPT-NeoX, GPT-J)
    parallel_residual_attr: str | None = None  # config attribute that overrides the default


FAMILIES: tuple[Family, ...] = (
    Family(
        name="gpt2", model_types=("gpt2",),
        blocks="transformer.h", embed="transformer.wte", pos_embed="transformer.wpe",
        final_norm="transformer.ln_f", lm_head="lm_head", attn="attn", mlp="mlp",
        norm_type="layernorm", mlp_type="gelu", positions="learned",
    ),
    Family(
        name="llama", model_types=("llama", "mistral"),
        blocks="model.layers", embed="model.embed_tokens", pos_embed=None,
        final_norm="model.norm", lm_head="lm_head", attn="self_attn", mlp="mlp",
        norm_type="rmsnorm", mlp_type="swiglu", positions="rope",
    ),
    Family(
        name="qwen2", model_types=("qwen2",),
        blocks="model.layers", embed="model.embed_tokens", pos_embed=None,
        final_norm="model.norm", lm_head="lm_head", attn="self_attn", mlp="mlp",
        norm_type="rmsnorm", mlp_type="swiglu", positions="rope",
    ),
    Family(
        name="phi3", model_types=("phi3",),
        blocks="model.layers", embed="model.embed_tokens", pos_embed=None,
        final_norm="model.norm", lm_head="lm_head", attn="self_attn", mlp="mlp",
        norm_type="rmsnorm", mlp_type="swiglu", positions="rope",
    ),
    Family(
        name="gpt_neox", model_types=("gpt_neox",),
        blocks="gpt_neox.layers", embed="gpt_neox.embed_in", pos_embed=None,
        final_norm="gpt_neox.final_layer_norm", lm_head="lm_head",
        attn="attention", mlp="mlp",
        norm_type="layernorm", mlp_type="gelu", positions="rope",
        parallel_residual=True, parallel_residual_attr="use_parallel_residual",
    ),
)

_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}

# Names tried, in order, when a model type has no row above.
_GENERIC_ATTN = ("self_attn", "attn", "attention", "self_attention")
_GENERIC_MLP = ("mlp", "feed_forward", "ffn")
_GENERIC_NORM = ("model.norm", "transformer.ln_f", "model.final_layernorm", "transformer.norm_f",
                 "gpt_neox.final_layer_norm", "model.decoder.final_layer_norm")


def family_for_config(config: Any) -> Family | None:
    """The table row for a transformers config, or None when the type has no row."""
    return _BY_TYPE.get(getattr(config, "model_type", None))


def supported_types() -> list[str]:
    return sorted(_BY_TYPE)


def uses_parallel_residual(family: Family, config: Any) -> bool:
    if family.parallel_residual_attr is not None:
        return bool(getattr(config, family.parallel_residual_attr, family.parallel_residual))
    return family.parallel_residual


@dataclass(frozen=True)
class ModelParts:
    """The modules of one loaded model, resolved through its Family."""

    family: Family
    blocks: list
    attns: list
    mlps: list
    final_norm: Any
    lm_head: Any
    embed: Any
    parallel_residual: bool


def _get(model: Any, path: str) -> Any:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def resolve_parts(model: Any) -> ModelParts:
    """Find blocks, attention, MLP, final norm and LM head of a causal LM.

    Known families come from the table; other models fall back to a generic search:
    the ModuleList whose length equals config.num_hidden_layers.
    """
    import torch.nn as nn

    config = model.config
    family = family_for_config(config)
    if family is not None:
        blocks = list(model.get_submodule(family.blocks))
        parts = ModelParts(
            family=family, blocks=blocks,
            attns=[b.get_submodule(family.attn) for b in blocks],
            mlps=[b.get_submodule(family.mlp) for b in blocks],
            final_norm=model.get_submodule(family.final_norm),
            lm_head=model.get_submodule(family.lm_head),
            embed=model.get_submodule(family.embed),
            parallel_residual=uses_parallel_residual(family, config),
        )
        return parts

    n_layers = getattr(config, "num_hidden_layers", None)
    lists = [(name, m) for name, m in model.named_modules()
             if isinstance(m, nn.ModuleList) and n_layers and len(m) == n_layers]
    if not lists:
        raise UnsupportedModel(
            f"cannot find the blocks of model type {config.model_type!r}; supported families: "
            + ", ".join(supported_types()))
    blocks_path, block_list = lists[0]
    blocks = list(block_list)

    def child(block: Any, names: tuple[str, ...], what: str) -> Any:
        for n in names:
            m = getattr(block, n, None)
            if m is not None:
                return m
        raise UnsupportedModel(
            f"cannot find the {what} of the blocks of model type {config.model_type!r}; "
            f"supported families: " + ", ".join(supported_types()))

    final_norm = next((m for p in _GENERIC_NORM if (m := _get(model, p)) is not None), None)
    lm_head = model.get_output_embeddings()
    embed = model.get_input_embeddings()
    if final_norm is None or lm_head is None:
        raise UnsupportedModel(
            f"cannot find the final norm or LM head of model type {config.model_type!r}; "
            "supported families: " + ", ".join(supported_types()))
    generic = Family(
        name=f"generic:{config.model_type}", model_types=(config.model_type,),
        blocks=blocks_path, embed="", pos_embed=None, final_norm="", lm_head="",
        attn="", mlp="", norm_type="unknown", mlp_type="unknown", positions="unknown",
    )
    return ModelParts(
        family=generic, blocks=blocks,
        attns=[child(b, _GENERIC_ATTN, "attention") for b in blocks],
        mlps=[child(b, _GENERIC_MLP, "MLP") for b in blocks],
        final_norm=final_norm, lm_head=lm_head, embed=embed,
        parallel_residual=bool(getattr(config, "use_parallel_residual", False)),
    )
