"""Mistral: Llama's block, with a sliding attention window when the config sets one."""

from dataclasses import replace

from fptrace.families.llama import FAMILY as LLAMA

FAMILY = replace(
    LLAMA, name="mistral", title="Mistral", model_types=("mistral",),
    tiny=dict(model_type="mistral", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
              num_attention_heads=4, num_key_value_heads=1, vocab_size=1000,
              max_position_embeddings=64, sliding_window=None),
)
