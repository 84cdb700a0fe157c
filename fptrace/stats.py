"""Per-layer statistics from the captured last-position vectors (pure functions of tensors)."""

from __future__ import annotations

from typing import Any


def norms(v: Any) -> Any:
    """(..., d) -> (...) L2 norm in float32."""
    import torch

    return torch.linalg.vector_norm(v.float(), dim=-1)


def cosine(a: Any, b: Any) -> Any:
    """(..., d), (..., d) -> (...) cosine similarity in float32; 0 where either is zero."""
    import torch

    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-12)


def top_k(logits: Any, k: int) -> tuple[list[int], list[float], list[float]]:
    """Top-k of one row of logits: ids, probabilities (float32 softmax), logits."""
    import torch

    row = logits.float()
    probs = torch.softmax(row, dim=-1)
    k = min(k, row.shape[-1])
    p, idx = probs.topk(k)
    return idx.tolist(), p.tolist(), row[idx].tolist()


def is_finite(*ts: Any) -> bool:
    import torch

    return all(t is None or bool(torch.isfinite(t).all()) for t in ts)
