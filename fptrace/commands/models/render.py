"""The table of `fptrace models`."""

from __future__ import annotations

from rich import box
from rich.console import RenderableType

from fptrace.commands.models.result import ModelEntry
from fptrace.render.fit import Col, fit_table

MODEL_COLS = (Col("alias", 0), Col("family", 1), Col("blocks", 2, "right"),
              Col("d_model", 2, "right"), Col("heads/KV", 3, "right"), Col("vocab", 4, "right"),
              Col("context", 4, "right"), Col("offline tokenizer", 5),
              Col("weights here", 0, wrap=True, min_width=12))


def models_table(rows: list[ModelEntry], width: int | None = None) -> RenderableType:
    body = [[r.alias, r.family, str(r.n_layers), str(r.d_model), f"{r.n_heads}/{r.n_kv_heads}",
             f"{r.vocab_size:,}", f"{r.context_length:,}" if r.context_length else "?",
             r.tokenizer or "—", r.weights] for r in rows]
    return fit_table(MODEL_COLS, body, width, box=box.HEAVY_HEAD,
                     title="Built-in models (--model ALIAS; --random-weights works for all of "
                     "them)", title_justify="left")
