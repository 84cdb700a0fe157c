"""The kinds a family is made of: its norm, its MLP, its position scheme, its Q/K norm.

Each is an enum whose value is the word shown to a user (the header, the JSON's `norm_type`,
`mlp_type`, `positions`), so a family file cannot misspell one and a question such as "is this MLP
gated?" is answered here once, not by comparing strings in each module. `unknown` is for the
generic family of a model type fptrace has no file for: its kinds are inferred, and where no rule
matched the header says so.
"""

from __future__ import annotations

from enum import Enum


class NormKind(str, Enum):
    layernorm = "layernorm"
    rmsnorm = "rmsnorm"
    rmsnorm_one_plus = "rmsnorm (1 + w)"  # Gemma: the gain is (1 + w)
    unknown = "unknown"

    @property
    def is_rms(self) -> bool:
        """RMSNorm: no mean subtraction, no bias."""
        return self in (NormKind.rmsnorm, NormKind.rmsnorm_one_plus)

    @property
    def one_plus(self) -> bool:
        """The stored weight w scales as (1 + w)."""
        return self is NormKind.rmsnorm_one_plus


class MlpKind(str, Enum):
    gelu = "gelu"  # down(GELU(up(x)))
    swiglu = "swiglu"  # down(SiLU(gate(x)) · up(x))
    geglu = "geglu"  # down(GELU(gate(x)) · up(x))
    moe = "moe"  # a router sends each token to k of E gated expert MLPs (Family.moe says how)
    unknown = "unknown"

    @property
    def gated(self) -> bool:
        """A gate projection beside the up projection: three matrices instead of two (each
        expert of an MoE block is such an MLP)."""
        return self in (MlpKind.swiglu, MlpKind.geglu, MlpKind.moe)


class PositionKind(str, Enum):
    learned = "learned"  # an absolute position embedding added to the token embedding
    rope = "rope"  # rotary embedding of Q and K inside attention
    unknown = "unknown"


class QkNorm(str, Enum):
    per_head = "per_head"  # an RMSNorm on each head of Q and K (Qwen3, Gemma 3)
    whole = "whole"  # one RMSNorm over every head of Q, one of K (OLMo 2)


class Scoring(str, Enum):
    """How an MoE router turns its logits into the scores it picks experts by."""

    softmax = "softmax"  # over all experts, then the top k
    sigmoid = "sigmoid"  # each logit on its own (DeepSeek-V3)
    softmax_top_k = "softmax over the top k"  # the top k logits first, a softmax over them (gpt-oss)


class EmbedScale(str, Enum):
    sqrt_d = "sqrt_d"  # the token embedding is multiplied by √d_model (Gemma)
