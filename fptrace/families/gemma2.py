"""Gemma 2: Gemma's block with norms before *and* after each sublayer (the stream receives the
post-norm outputs), attention-logit and final-logit softcapping, alternating sliding-window
layers. Recomputed by gemma.py's block, which reads these facts from this record."""

from dataclasses import replace

from fptrace.families import LlamaCppNames, Tap
from fptrace.families.gemma import FAMILY as GEMMA
from fptrace.families.llama import LLAMA_TAPS
from fptrace.points import Point

# llama.cpp's gemma2 graph (checked on a tiny GGUF, tests/test_llamacpp_families.py): the
# embedding after its scale by √d is `inp_scaled`; the stream receives the post-norms
# (`attn_post_norm`, `ffn_post_norm`), and `sa_out` is the stream between them; the MLP's
# GELU(gate)·up is `ffn_geglu`; `result_output` is after the final softcap. Its graph names
# `ffn_post_norm` without the block (every block's node has the one name), so it is read as
# `l_out`'s operand 0. The attention output before its post-norm is not named (nor is it an
# operand of a named node), so it is not compared. The converter stores each norm's weight with
# the 1 Gemma's RMSNorm adds.
LLAMACPP_NAMES = LlamaCppNames(
    archs=("gemma2",), added=(Point.ln1_post, Point.ln2_post),
    operands={"ffn_post_norm": ("l_out", 0)},
    points={Point.embed: "inp_scaled", Point.ln1: "attn_norm", Point.q: "Qcur",
            Point.k: "Kcur", Point.v: "Vcur", Point.z: "kqv_out",
            Point.ln1_post: "attn_post_norm", Point.resid_mid: "sa_out", Point.ln2: "ffn_norm",
            Point.mlp_gate: "ffn_gate", Point.mlp_up: "ffn_up", Point.mlp_act: "ffn_geglu",
            Point.mlp_out: "ffn_out", Point.ln2_post: "ffn_post_norm",
            Point.resid_post: "l_out", Point.final_norm: "result_norm",
            Point.logits: "result_output"},
    no_emulation="Gemma's RMSNorm multiplies by (1 + w), which the norm step does not, and its "
                 "GELU comes from ggml's float16 table, which no step reproduces")

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
    llamacpp_names=LLAMACPP_NAMES, gguf_weights=None,  # transformers' GGUF loader reads it
    # transformers' GGUF loader takes Gemma 2's softcaps to be 50 and 30, whatever the file says
    gguf_config={"attn_logit_softcapping": "attn_logit_softcapping",
                 "final_logit_softcapping": "final_logit_softcapping"},
    # softcaps small enough to bite on random weights; every other layer a 3-token window
    tiny=dict(model_type="gemma2", num_hidden_layers=3, hidden_size=64, intermediate_size=96,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1000,
              max_position_embeddings=64, sliding_window=3, query_pre_attn_scalar=24,
              attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
)
