"""Qwen3: Llama's block with an RMSNorm on each head of Q and K before RoPE."""

from dataclasses import replace

from fptrace.families.kinds import QkNorm
from fptrace.families.llama import FAMILY as LLAMA

FAMILY = replace(
    LLAMA, name="qwen3", title="Qwen3", model_types=("qwen3",), qk_norm=QkNorm.per_head,
    tiny=dict(model_type="qwen3", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1000,
              max_position_embeddings=64, tie_word_embeddings=True),
)
