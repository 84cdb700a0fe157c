"""Gemma 2: Gemma's block with norms before *and* after each sublayer (the stream receives the
post-norm outputs), attention-logit and final-logit softcapping, alternating sliding-window
layers. Recomputed by gemma.py's block, which reads these facts from this record."""

from dataclasses import replace

from fptrace.families import Tap
from fptrace.families.gemma import FAMILY as GEMMA
from fptrace.families.llama import LLAMA_TAPS
from fptrace.points import Point

FAMILY = replace(
    GEMMA, name="gemma2", title="Gemma 2", model_types=("gemma2",),
    attn_added="post_attention_layernorm", mlp_added="post_feedforward_layernorm",
    attn_softcap_attr="attn_logit_softcapping", final_softcap_attr="final_logit_softcapping",
    labels={"input_layernorm": "norm before attention",
            "post_attention_layernorm": "norm after attention (what is added)",
            "pre_feedforward_layernorm": "norm before the MLP",
            "post_feedforward_layernorm": "norm after the MLP (what is added)"},
    taps={**LLAMA_TAPS, Point.resid_mid: Tap("pre_feedforward_layernorm", "in"),
          Point.ln2: Tap("pre_feedforward_layernorm")},
    # softcaps small enough to bite on random weights; every other layer a 3-token window
    tiny=dict(model_type="gemma2", num_hidden_layers=3, hidden_size=64, intermediate_size=96,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1000,
              max_position_embeddings=64, sliding_window=3, query_pre_attn_scalar=24,
              attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
)
