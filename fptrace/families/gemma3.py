"""Gemma 3 (text): Gemma 2's block with an RMSNorm on each head of Q and K, and separate RoPE
bases for local (sliding-window) and global layers. Recomputed by gemma.py's block."""

from dataclasses import replace

from fptrace.families.gemma2 import FAMILY as GEMMA2
from fptrace.families.gemma2 import LLAMACPP_NAMES as GEMMA2_NAMES
from fptrace.families.kinds import QkNorm

# llama.cpp's gemma3 graph (checked on a tiny GGUF, tests/test_llamacpp_families.py): Gemma 2's
# names (q and k after their per-head norms and RoPE are still the last `Qcur`, `Kcur`), with
# `ffn_post_norm` named by its block, so no operand is read
LLAMACPP_NAMES = replace(GEMMA2_NAMES, archs=("gemma3",), operands={})

FAMILY = replace(
    GEMMA2, name="gemma3", title="Gemma 3", model_types=("gemma3_text",), qk_norm=QkNorm.per_head,
    llamacpp_names=LLAMACPP_NAMES, gguf_config={},  # Gemma 2's softcaps are not Gemma 3's
    tiny=dict(model_type="gemma3_text", num_hidden_layers=3, hidden_size=64,
              intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=1000, max_position_embeddings=64, sliding_window=3,
              sliding_window_pattern=2, query_pre_attn_scalar=16, final_logit_softcapping=5.0,
              rope_parameters={"full_attention": {"rope_type": "default",
                                                  "rope_theta": 1_000_000.0},
                               "sliding_attention": {"rope_type": "default",
                                                     "rope_theta": 10_000.0}}),
)
