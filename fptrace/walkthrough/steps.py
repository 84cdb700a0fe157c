"""The recorder the family modules write to: each call names a tensor, says how it was made,
and keeps its shape and a few of its values (never the tensor itself, except the few the
checks and the attention tables need)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..results import ExplainStep


@dataclass
class Steps:
    head: int  # the query head shown
    kv_head: int  # the key/value head it reads
    n_heads: int
    n_kv_heads: int
    n_preview: int = 4
    section: str = "attention"
    items: list = field(default_factory=list)
    kept: dict = field(default_factory=dict)  # name -> tensor, for checks and tables

    def __call__(self, name: str, formula: str, t: Any, note: str | None = None,
                 keep: bool = False, shown: str | None = None) -> Any:
        """shown: which tensor the preview values are of, when a step makes several (Q and K)."""
        where, values = self._preview(t)
        if shown:
            where = f"{shown}, {where}"
        self.items.append(ExplainStep(
            index=len(self.items) + 1, section=self.section, name=name, formula=formula,
            shape=tuple(int(d) for d in t.shape), where=where,
            preview=tuple(float(v) for v in values), note=note))
        if keep:
            self.kept[name] = t.detach()
        return t

    def _preview(self, t: Any) -> tuple[str, list[float]]:
        """A few values a reader can follow from step to step: the last position; for a
        per-head tensor, the chosen head (or the key/value head it reads)."""
        n = self.n_preview
        if t.dim() == 4:  # (B, heads, T, X)
            h = self.head if t.shape[1] == self.n_heads else self.kv_head
            T = t.shape[2]
            return f"head {h}, pos {T - 1}", t[0, h, -1, :n].tolist()
        if t.dim() == 3:  # (B, T, X)
            return f"pos {t.shape[1] - 1}", t[0, -1, :n].tolist()
        if t.dim() == 2 and t.shape[0] == t.shape[1] and t.shape[0] > 1:  # a (T, T) mask
            return f"row {t.shape[0] - 1}", t[-1, :n].tolist()
        if t.dim() == 2:  # (B, X)
            return "first values", t[0, :n].tolist()
        return "first values", t.reshape(-1)[:n].tolist()
