"""Mixtral: Mistral's block with a sparse mixture of experts in place of the MLP.

A router (mlp.gate, a linear map d → E) scores the experts; each token takes the top k by
softmax probability, their probabilities renormalised to sum to 1; the routed experts are SwiGLU
MLPs stored as 3-D tensors (mlp.experts.gate_up_proj (E, 2·I, d), mlp.experts.down_proj
(E, d, I)). Qwen2-MoE, Qwen3-MoE and OLMoE are this record with a few facts changed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from fptrace.families import Moe, Tap
from fptrace.families.kinds import MlpKind
from fptrace.families.llama import FAMILY as LLAMA
from fptrace.families.llama import LLAMA_TAPS
from fptrace.points import Point

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def moe(cfg: PretrainedConfig) -> Moe | None:
    """Mixtral's experts: num_local_experts of intermediate_size, top num_experts_per_tok,
    always renormalised."""
    n = getattr(cfg, "num_local_experts", 0)
    if not n:
        return None
    return Moe(n_experts=int(n), top_k=int(cfg.num_experts_per_tok),
               d_expert=int(cfg.intermediate_size), renormalise=True)


# where an MoE block shows its points: the MLP module's output (its first item) is what the
# stream receives; the experts' inner activations are per expert and show in no one module
MOE_TAPS = {p: t for p, t in LLAMA_TAPS.items()
            if p not in (Point.mlp_gate, Point.mlp_up, Point.mlp_act)} | {Point.mlp_out: Tap("mlp")}

FAMILY = replace(
    LLAMA, name="mixtral", title="Mixtral", model_types=("mixtral",), mlp_type=MlpKind.moe, moe=moe,
    taps=MOE_TAPS,
    # a dense SwiGLU MLP of the family (Qwen2-MoE's shared expert, DeepSeek-V3's shared experts
    # and first blocks, the Qwen-MoE mlp_only_layers): Llama's projections
    moe_dense_mlp=("gate_proj", "up_proj", "down_proj"),
    tiny=dict(model_type="mixtral", num_hidden_layers=2, hidden_size=64, intermediate_size=48,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
              max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2,
              sliding_window=None, tie_word_embeddings=False),
)
