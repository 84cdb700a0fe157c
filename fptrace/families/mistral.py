"""Mistral: Llama's block, with a sliding attention window when the config sets one."""

from dataclasses import replace

from .llama import FAMILY as LLAMA

FAMILY = replace(LLAMA, name="mistral", title="Mistral", model_types=("mistral",))
