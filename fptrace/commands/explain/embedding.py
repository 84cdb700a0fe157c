"""Where the walkthrough starts: each token id selects its row of the embedding matrix; GPT-2
adds the row of its position from the position matrix; Gemma multiplies by √d. Recomputed from
the model's own matrices and checked against the stream that enters block 0."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from fptrace.commands.explain.result import EmbeddingRow
from fptrace.families.kinds import EmbedScale
from fptrace.families.ops import Steps
from fptrace.models.tensor_parallel import full
from fptrace.points import Point

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel


def embedding(lm: LoadedModel, ids: Sequence[int], s: Steps, n: int = 4) -> tuple[Any, tuple]:
    """x: (1, T, C), the stream entering block 0, recomputed; and one row per token with the
    first n values of each part."""
    fam = lm.parts.family
    T = len(ids)
    idx = torch.tensor(list(ids), device=lm.parts.embed.weight.device)
    W_E = full(lm.parts.embed.weight).float()  # (V, C), whole even when sharded
    V, C = W_E.shape
    s.section = "embedding"
    tok = W_E[idx][None]  # (1, T, C)
    s("token embedding", f"e = W_E[ids]   W_E is ({V}, {C}): token id i selects row i", tok)
    x = tok  # (1, T, C)
    pos = None
    if fam.pos_embed:
        W_P = full(lm.model.get_submodule(fam.pos_embed).weight).float()  # (positions, C)
        pos = W_P[torch.arange(T, device=W_P.device)][None]  # (1, T, C)
        s("position embedding", f"p = W_P[0..{T - 1}]   W_P is {tuple(W_P.shape)}: position t "
          "selects row t", pos)
        x = x + pos  # (1, T, C)
        s("sum", "x = e + p", x)
    scale = None
    if fam.embed_scale is EmbedScale.sqrt_d:
        scale = math.sqrt(C)
        x = x * torch.tensor(scale, dtype=lm.parts.embed.weight.dtype).float()  # (1, T, C)
        s("scale by √d", f"x = e · √{C} = e · {scale:.4g}", x)
    p = getattr(lm.config, "embd_pdrop", None)
    s("dropout", (f"identity in eval mode (training zeroes a fraction {p:g} of these values and "
                  f"scales the rest by 1/(1 − {p:g}))") if p else
      "identity in eval mode (no dropout in inference)", x, point=Point.embed)
    rows = tuple(EmbeddingRow(
        position=t, id=int(ids[t]), text=lm.token_text(int(ids[t])),
        token_row=tuple(float(v) for v in tok[0, t, :n].tolist()),
        position_row=None if pos is None else tuple(float(v) for v in pos[0, t, :n].tolist()),
        scale=scale, stream=tuple(float(v) for v in x[0, t, :n].tolist())) for t in range(T))
    return x, rows
