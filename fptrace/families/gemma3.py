"""Gemma 3 (text): Gemma 2's block with an RMSNorm on each head of Q and K, and separate RoPE
bases for local (sliding-window) and global layers."""

from dataclasses import replace

from .gemma2 import FAMILY as GEMMA2

FAMILY = replace(GEMMA2, name="gemma3", title="Gemma 3", model_types=("gemma3_text",),
                 qk_norm="per_head")
