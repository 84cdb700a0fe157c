"""Qwen2: Llama's block with biases on the Q, K and V projections."""

from dataclasses import replace

from .llama import FAMILY as LLAMA

FAMILY = replace(LLAMA, name="qwen2", title="Qwen2", model_types=("qwen2",))
