"""Phi-3: Llama-like, with a fused qkv_proj and a fused gate_up_proj, partial rotary."""

from dataclasses import replace

from .llama import FAMILY as LLAMA, LLAMA_LABELS

FAMILY = replace(LLAMA, name="phi3", title="Phi-3", model_types=("phi3",), walkthrough="phi3",
                 labels={**LLAMA_LABELS, "qkv_proj": "fused QKV projection",
                         "gate_up_proj": "MLP gate+up (fused)"})
