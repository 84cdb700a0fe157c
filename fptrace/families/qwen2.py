"""Qwen2: Llama's block with biases on the Q, K and V projections."""

from dataclasses import replace

from fptrace.families.llama import FAMILY as LLAMA

FAMILY = replace(
    LLAMA, name="qwen2", title="Qwen2", model_types=("qwen2",),
    tiny=dict(model_type="qwen2", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
              max_position_embeddings=64, tie_word_embeddings=True),
)
