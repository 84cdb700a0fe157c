"""Qwen2: Llama's block with biases on the Q, K and V projections."""

from dataclasses import replace

from fptrace.families.llama import FAMILY as LLAMA
from fptrace.families.llama import LLAMACPP_NAMES as LLAMA_NAMES

# llama.cpp's qwen2 graph (checked on a tiny GGUF, tests/test_llamacpp_families.py): Llama's
# names, but its converter leaves W_Q and W_K unpermuted (its RoPE rotates halves, as
# transformers' does) and its graph names no attention output: ffn_inp's operand 0 is it
LLAMACPP_NAMES = replace(LLAMA_NAMES, archs=("qwen2",), rope_adjacent=False,
                         operands={"attn_out": ("ffn_inp", 0)})

FAMILY = replace(
    LLAMA, name="qwen2", title="Qwen2", model_types=("qwen2",),
    llamacpp_names=LLAMACPP_NAMES,
    tiny=dict(model_type="qwen2", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
              max_position_embeddings=64, tie_word_embeddings=True),
)
