"""OLMo 2: norms *after* each sublayer only (no norm before attention or the MLP), and an
RMSNorm over the whole Q and K projections."""

from dataclasses import replace

from .llama import FAMILY as LLAMA

FAMILY = replace(
    LLAMA, name="olmo2", title="OLMo 2", model_types=("olmo2",), walkthrough="olmo2",
    attn_added="post_attention_layernorm", mlp_added="post_feedforward_layernorm",
    qk_norm="whole",
    labels={"post_attention_layernorm": "norm after attention (what is added)",
            "post_feedforward_layernorm": "norm after the MLP (what is added)"},
)
