"""Qwen3: Llama's block with an RMSNorm on each head of Q and K before RoPE."""

from dataclasses import replace

from .llama import FAMILY as LLAMA

FAMILY = replace(LLAMA, name="qwen3", title="Qwen3", model_types=("qwen3",), qk_norm="per_head")
