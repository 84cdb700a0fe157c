"""The part of attention every family shares, once: scores, the causal mask, softmax, the
weighted sum of values and the concatenation of heads. Straight-line, recording each step."""

from __future__ import annotations

import math
from typing import Any

import torch

from .steps import Steps


def sliding_window(cfg: Any, layer: int) -> int | None:
    """The attention window of block `layer`, or None: the config's sliding_window, unless its
    layer_types say this layer attends globally."""
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types and layer_types[layer] != "sliding_attention":
        return None
    return window


def repeat_kv(k: Any, v: Any, nh: int, s: Steps) -> tuple[Any, Any]:
    """Grouped-query attention: each of the nkv key/value heads serves nh / nkv query heads.
    k, v: (B, nkv, T, hd) -> (B, nh, T, hd) each."""
    nkv = k.shape[1]
    rep = nh // nkv
    k = k.repeat_interleave(rep, dim=1)  # (B, nh, T, hd)
    v = v.repeat_interleave(rep, dim=1)  # (B, nh, T, hd)
    s("repeat K/V (GQA)", f"each of {nkv} K/V heads serves {rep} query heads" if rep > 1
      else "one K/V head per query head: nothing to repeat", k, shown="K")
    return k, v


def causal_attention(q: Any, k: Any, v: Any, s: Steps, *, scale: float | None = None,
                     window: int | None = None, softcap: float | None = None) -> Any:
    """q, k, v: (B, nh, T, hd), K and V already repeated for grouped-query attention.
    softcap: Gemma 2's attention-logit cap, cap·tanh(scores / cap), before the mask.
    Returns y: (B, T, nh*hd), the heads side by side, ready for W_O."""
    B, nh, T, hd = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(hd)
    att = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, T)
    s("scores", f"att = q · kᵀ / √{hd}" if math.isclose(scale, 1.0 / math.sqrt(hd))
      else f"att = q · kᵀ · {scale:g}", att, keep=True)
    if softcap:
        att = torch.tanh(att / softcap) * softcap  # (B, nh, T, T)
        s("softcap", f"att = {softcap:g} · tanh(att / {softcap:g})   (scores kept within "
          f"±{softcap:g})", att)
    i = torch.arange(T, device=q.device)[:, None]  # (T, 1) query positions
    j = torch.arange(T, device=q.device)[None, :]  # (1, T) key positions
    hidden = (j > i) | ((i - j >= window) if window else torch.zeros_like(j > i))  # (T, T)
    mask = torch.zeros(T, T, device=q.device).masked_fill(hidden, float("-inf"))  # (T, T)
    s("causal mask", "mask[i, j] = −∞ where j > i" + (f" or i − j ≥ {window}" if window else "")
      + ", else 0", mask)
    att = att + mask  # (B, nh, T, T)
    s("scores + mask", "att = att + mask   (position i sees positions 0..i)", att, keep=True)
    att = torch.exp(att - att.amax(dim=-1, keepdim=True))  # (B, nh, T, T)
    att = att / att.sum(dim=-1, keepdim=True)  # (B, nh, T, T)
    s("softmax", "w = exp(att − max) / Σ_j exp(att − max)   (each row sums to 1)", att,
      keep=True)
    y = att @ v  # (B, nh, T, hd)
    s("weights · V", "y = w · v", y)
    y = y.transpose(1, 2).reshape(B, T, nh * hd)  # (B, T, nh*hd)
    s("concat heads", f"y → transpose(1, 2) → (B, T, {nh * hd})", y)
    return y
