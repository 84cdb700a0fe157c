"""Per-layer statistics from the captured last-position vectors (pure functions of tensors)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def norms(v: torch.Tensor) -> torch.Tensor:
    """(..., d) -> (...) L2 norm in float32."""
    import torch

    return torch.linalg.vector_norm(v.float(), dim=-1)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(..., d), (..., d) -> (...) cosine similarity in float32; 0 where either is zero."""
    import torch

    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-12)


def top_k(logits: torch.Tensor, k: int) -> tuple[list[int], list[float], list[float]]:
    """Top-k of one row of logits: ids, probabilities (float32 softmax), logits."""
    import torch

    row = logits.float()
    probs = torch.softmax(row, dim=-1)
    k = min(k, row.shape[-1])
    p, idx = probs.topk(k)
    return idx.tolist(), p.tolist(), row[idx].tolist()


def rank(row: torch.Tensor, i: int) -> int:
    """1 + how many entries of a row of logits (or probabilities) beat entry i."""
    return int((row > row[i]).sum()) + 1


def is_finite(*ts: Any) -> bool:
    import torch

    return all(t is None or bool(torch.isfinite(t).all()) for t in ts)


# unit roundoff of each dtype: one rounding of a value v errs by at most EPS·|v| / 2
EPS = {"float64": 2.0 ** -52, "float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
DECOMPOSITION_RTOL = 1e-4


def decomposition(pre: Any, post: Any, attn: Any, mlp: Any, dtype: str) -> tuple[Any, Any]:
    """Does what attention and the MLP added make up what the block added?

    pre, post, attn, mlp: (..., d) float32 copies of the stream before and after a block and of
    the two sublayer outputs the stream received. Returns (mismatch, bound), each (...):
    mismatch = ‖(post − pre) − (attn + mlp)‖; bound = RTOL·‖post − pre‖ plus the rounding the
    model's two residual adds may do in its dtype (EPS·(‖pre‖ + ‖attn‖ + ‖post‖ + ‖mlp‖), a
    bound on the norm of the two rounding errors, each at most EPS/2 of its sum)."""
    added = post - pre
    mismatch = norms(added - (attn + mlp))
    eps = EPS.get(dtype, EPS["bfloat16"])
    bound = DECOMPOSITION_RTOL * norms(added) + eps * (norms(pre) + norms(attn) + norms(post)
                                                      + norms(mlp))
    return mismatch, bound


def decomposition_rule(dtype: str) -> str:
    eps = EPS.get(dtype, EPS["bfloat16"])
    return (f"‖Δ − (attn + mlp)‖ ≤ {DECOMPOSITION_RTOL:g}·‖Δ‖ + {eps:.3g}·(‖resid_pre‖ + "
            f"‖attn‖ + ‖resid_post‖ + ‖mlp‖)   ({dtype} rounding of the two residual adds)")
