"""The table of `fptrace models`."""

from __future__ import annotations

from rich.table import Table

from ..results import ModelEntry


def models_table(rows: list[ModelEntry]) -> Table:
    t = Table(title="Built-in models (--model ALIAS; --random-weights works for all of them)",
              title_justify="left")
    for name, justify in (("alias", "left"), ("family", "left"), ("blocks", "right"),
                          ("d_model", "right"), ("heads/KV", "right"), ("vocab", "right"),
                          ("context", "right"), ("offline tokenizer", "left"),
                          ("weights here", "left")):
        t.add_column(name, justify=justify)
    for r in rows:
        t.add_row(r.alias, r.family, str(r.n_layers), str(r.d_model),
                  f"{r.n_heads}/{r.n_kv_heads}", f"{r.vocab_size:,}",
                  f"{r.context_length:,}" if r.context_length else "?", r.tokenizer or "—",
                  r.weights)
    return t
