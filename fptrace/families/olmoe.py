"""OLMoE: OLMo's block (one RMSNorm over the whole Q and the whole K projection, before they
are split into heads) in front of the usual pre-norms, with a sparse mixture of experts of
intermediate_size each; the chosen probabilities are renormalised only when norm_topk_prob
says so."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fptrace.families import Moe
from fptrace.families.kinds import QkNorm
from fptrace.families.mixtral import FAMILY as MIXTRAL


def moe(cfg: Any) -> Moe | None:
    n = getattr(cfg, "num_experts", 0)
    if not n:
        return None
    return Moe(n_experts=int(n), top_k=int(cfg.num_experts_per_tok),
               d_expert=int(cfg.intermediate_size),
               renormalise=bool(getattr(cfg, "norm_topk_prob", False)))


FAMILY = replace(
    MIXTRAL, name="olmoe", title="OLMoE", model_types=("olmoe",), qk_norm=QkNorm.whole, moe=moe,
    tiny=dict(model_type="olmoe", num_hidden_layers=2, hidden_size=64, intermediate_size=32,
              num_attention_heads=4, num_key_value_heads=4, vocab_size=1000,
              max_position_embeddings=64, num_experts=8, num_experts_per_tok=2,
              norm_topk_prob=False, tie_word_embeddings=False),
)
