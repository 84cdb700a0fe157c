"""gpt-oss: a Llama-like block (biases on Q, K, V and O) whose attention adds a learned sink
per head (a logit every query sees, that takes part of the softmax and adds nothing), on
alternate sliding-window and full layers, and whose MLP is a mixture of experts: a router with
a bias takes the top k logits and a softmax over those k only gives their weights; each expert
is a clamped SwiGLU with biases, (up + 1) · gate · σ(α · gate), gate and up interleaved in one
tensor.

Explain recomputes its blocks with Llama's block: the sinks join each row's softmax, the
experts' clamped SwiGLU is ops.moe_mlp's."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from fptrace.families import Moe
from fptrace.families.kinds import Scoring
from fptrace.families.mixtral import FAMILY as MIXTRAL

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def moe(cfg: PretrainedConfig) -> Moe | None:
    n = getattr(cfg, "num_local_experts", 0)
    if not n:
        return None
    return Moe(n_experts=int(n), top_k=int(cfg.num_experts_per_tok),
               d_expert=int(cfg.intermediate_size), scoring=Scoring.softmax_top_k,
               router_bias=True)


FAMILY = replace(
    MIXTRAL, name="gpt_oss", title="gpt-oss", model_types=("gpt_oss",), moe=moe,
    router="router", attn_sinks="sinks",
    tiny=dict(model_type="gpt_oss", num_hidden_layers=2, hidden_size=64, intermediate_size=32,
              head_dim=16, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
              num_experts_per_tok=2, sliding_window=4, vocab_size=1000,
              max_position_embeddings=64,
              layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False),
)
