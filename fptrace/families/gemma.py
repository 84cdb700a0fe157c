"""Gemma (1): the embedding scaled by √d, RMSNorm with a (1 + w) scale, GeGLU MLP."""

from dataclasses import replace

from .llama import FAMILY as LLAMA

FAMILY = replace(LLAMA, name="gemma", title="Gemma", model_types=("gemma",),
                 norm_type="rmsnorm (1 + w)", mlp_type="geglu", embed_scale="sqrt_d",
                 walkthrough="gemma")
