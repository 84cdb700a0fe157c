"""Qwen3: Llama's block with an RMSNorm on each head of Q and K before RoPE."""

from dataclasses import replace

from fptrace.families.kinds import QkNorm
from fptrace.families.llama import FAMILY as LLAMA
from fptrace.families.llama import LLAMACPP_NAMES as LLAMA_NAMES

# llama.cpp's qwen3 graph (checked on a tiny GGUF, tests/test_llamacpp_families.py): Llama's
# names, but its converter leaves W_Q and W_K unpermuted (its RoPE rotates halves, as
# transformers' does) and its graph names no attention output: ffn_inp's operand 0 is it
LLAMACPP_NAMES = replace(LLAMA_NAMES, archs=("qwen3",), rope_adjacent=False,
                         operands={"attn_out": ("ffn_inp", 0)})

FAMILY = replace(
    LLAMA, name="qwen3", title="Qwen3", model_types=("qwen3",), qk_norm=QkNorm.per_head,
    llamacpp_names=LLAMACPP_NAMES,
    # transformers' GGUF loader takes Qwen3's head width to be 128, whatever the file says
    gguf_config={"head_dim": "attention.key_length"},
    tiny=dict(model_type="qwen3", num_hidden_layers=2, hidden_size=64, intermediate_size=96,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1000,
              max_position_embeddings=64, tie_word_embeddings=True),
)
