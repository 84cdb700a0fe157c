"""Gemma 2: Gemma's block with norms before *and* after each sublayer (the stream receives the
post-norm outputs), attention-logit and final-logit softcapping, alternating sliding-window
layers."""

from dataclasses import replace

from .gemma import FAMILY as GEMMA

FAMILY = replace(
    GEMMA, name="gemma2", title="Gemma 2", model_types=("gemma2",),
    attn_added="post_attention_layernorm", mlp_added="post_feedforward_layernorm",
    attn_softcap_attr="attn_logit_softcapping", final_softcap_attr="final_logit_softcapping",
    labels={"input_layernorm": "norm before attention",
            "post_attention_layernorm": "norm after attention (what is added)",
            "pre_feedforward_layernorm": "norm before the MLP",
            "post_feedforward_layernorm": "norm after the MLP (what is added)"},
)
