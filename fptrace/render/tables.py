"""Rich tables for `fptrace run`."""

from __future__ import annotations

import os
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from fptrace.render.fit import Col, RowStyle, fit_table
from fptrace.render.text import bar, norm, num, visible
from fptrace.results import ModelInfo, Token, Trace


def header(info: ModelInfo) -> RenderableType:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")  # a long path folds onto the next line, never cut
    kv = info.n_kv_heads
    heads = f"{info.n_heads} / {kv} KV" + (" (grouped-query)" if kv != info.n_heads else "")
    generic = bool(info.inferred or info.unknown)
    family = (f"{info.family}  (no family module for this model type: what fptrace inferred "
              "and what it does not know are listed below)" if generic else
              f"{info.family}  ({info.norm_type}, {info.mlp_type} MLP, {info.positions} positions"
              + (", parallel attn+MLP" if info.parallel_residual else "") + ")")
    rows = [
        ("model", info.name),
        ("family", family),
        *([("inferred", "; ".join(info.inferred) or "nothing")] if generic else []),
        *([("unknown", "; ".join(info.unknown))] if info.unknown else []),
        ("blocks", str(info.n_layers)),
        ("d_model", f"{info.d_model}   heads {heads}   head_dim {info.head_dim}"
                    + (f"   d_mlp {info.d_mlp}" if info.d_mlp and not info.moe else "")),
        *([("MoE", info.moe)] if info.moe else []),
        ("vocab", f"{info.vocab_size:,}   context {info.context_length or '?'}"),
        ("params", f"{info.n_params:,}" + ("   (LM head tied to embedding)"
                                           if info.tied_embeddings else "")),
        ("device", f"{info.device}   dtype {info.dtype}" + (
            f"   tensor parallel: {info.tensor_parallel} ranks" if info.tensor_parallel > 1
            else "")),
        *([("placement", "; ".join(info.placement))] if info.placement else []),
        ("weights", shown_source(info.source)),
    ]
    for k, v in rows:
        grid.add_row(k, Text(v))
    title = "fptrace" + ("  [bold red]RANDOM WEIGHTS[/]" if info.random_weights else "")
    return Panel(grid, title=title, title_align="left", expand=False)


def shown_source(source: str) -> str:
    """Where the weights came from, as a reader relates to it: a file of an installed package as
    `package/file` (not the site-packages folder of the machine it ran on), a path under the
    home folder as `~/...`, anything else (a hub id, random weights) as it is. The JSON keeps
    the full path."""
    parts = source.split(os.sep)
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            i = len(parts) - 1 - parts[::-1].index(marker)
            return "/".join(parts[i + 1:])
    home = os.path.expanduser("~")
    if home not in ("", os.sep) and source.startswith(home + os.sep):
        return "~" + source[len(home):]
    return source


def token_table(toks: tuple[Token, ...], title: str = "Tokens",
                width: int | None = None, note: str | None = None) -> RenderableType:
    """Position, id, the vocabulary's piece (where the tokenizer keeps pieces) and text
    (whitespace made visible) of each token; a long text wraps. The tokens a chat template added
    are dimmed and marked in a column of their own."""
    pieces = any(tok.piece is not None for tok in toks)
    cols = (Col("pos", 0, "right"), Col("id", 0, "right")) \
        + ((Col("piece", 1, wrap=True),) if pieces else ()) + (Col("text", 0, wrap=True),)
    marked = any(tok.template for tok in toks)
    if marked:
        cols += (Col("from", 0),)
    rows = [RowStyle([str(tok.position), str(tok.id)]
                     + ([Text(visible(tok.piece)) if tok.piece is not None else "—"]
                        if pieces else [])
                     + [Text(visible(tok.text))]
                     + ([("template" if tok.template else "message")] if marked else []),
                     "dim" if tok.template else None) for tok in toks]
    table = fit_table(cols, rows, width, box=box.HEAVY_HEAD, title=title, title_justify="left")
    return table if note is None else Group(table, Text(note, style="dim"))


# the columns of the per-layer table, most important first (priority 0: always shown)
LAYER_COLS = (Col("layer", 0, "right"), Col("‖resid‖", 0, "right"), Col("", 5),
              Col("mean\n‖resid‖", 6, "right"), Col("‖attn‖", 1, "right"),
              Col("‖mlp‖", 1, "right"), Col("‖Δ‖", 1, "right"), Col("cos\nprev", 7, "right"),
              Col("first values", 9), Col("logit lens\ntop-1", 2), Col("p", 2, "right"),
              Col("rank\nof final", 4, "right"), Col("KL\n(nats)", 4, "right"),
              Col("H\n(nats)", 8, "right"))


def layers(trace: Trace, width: int | None = 120) -> RenderableType:
    """One row for the embedding and one per block; the columns that fit in `width` (every
    column when width is None), the others named in one dim line."""
    rows = trace.layers
    top = max((l.resid_norm_last for l in rows if l.finite), default=0.0)
    body = []
    first_bad = next((l for l in rows if not l.finite), None)  # where NaN/Inf first appeared
    for l in rows:
        name = "embed" if l.layer is None else str(l.layer)
        if l is first_bad:
            name = "⚠ " + name
        body.append(RowStyle([
            name, norm(l.resid_norm_last), Text(bar(l.resid_norm_last, top, 8), style="green"),
            norm(l.resid_norm_mean), norm(l.attn_norm_last), norm(l.mlp_norm_last),
            norm(l.added_norm_last), num(l.cos_prev, 3), _snippet(l.snippet),
            Text(visible(l.lens_text)) if l.lens_text is not None else "—",
            num(l.lens_prob, 3), "—" if l.lens_rank is None else f"{l.lens_rank:,}",
            num(l.lens_kl, 2), num(l.lens_entropy, 2)], None if l.finite else "bold red"))
    cols = LAYER_COLS if any(l.snippet for l in rows) else \
        tuple(c for c in LAYER_COLS if c.header != "first values")
    if len(cols) != len(LAYER_COLS):
        body = [RowStyle([c for c, col in zip(r.cells, LAYER_COLS) if col in cols], r.style)
                for r in body]
    fn = trace.final_norm
    last = len(rows) - 2
    caption = (f"final_norm (applied to the stream after block {last}): ‖x‖ = "
               f"{norm(fn.norm_last)}, first values {_snippet(fn.snippet)}")
    check = getattr(trace, "decomposition", None)
    if check is not None and not check.holds:
        caption += "\n— " + check.note()
    return fit_table(cols, body, width, padding=(0, 1), caption=caption, caption_justify="left",
                     title="Residual stream per layer (last position; mean over positions "
                     "where noted)", title_justify="left")


def _snippet(values: tuple[float, ...]) -> str:
    return " ".join(f"{x:+.2f}" for x in values)


TOP_K_COLS = (Col("rank", 0, "right"), Col("token", 0), Col("id", 1, "right"),
              Col("prob", 0, "right"), Col("", 3), Col("logit", 2, "right"))


def top_k(trace: Trace, width: int | None = None) -> RenderableType:
    rows = [[str(tok.rank), Text(visible(tok.text)), str(tok.id), f"{tok.prob:.4f}",
             Text(bar(tok.prob, 1.0, 10), style="magenta"), num(tok.logit, 3)]
            for tok in trace.top_k]
    return fit_table(TOP_K_COLS, rows, width, box=box.HEAVY_HEAD,
                     title=f"Top-{len(trace.top_k)} next tokens", title_justify="left")


def check_lines(checks: tuple[Any, ...], failed: str) -> RenderableType:
    """A command's checks of its own numbers, one line each (✓ or ✗, what, measured, rule), and
    when one fails a last line in red: `failed` says what not to trust."""
    text = Text()
    for c in checks:
        text.append("✓ " if c.ok else "✗ ", style="bold green" if c.ok else "bold red")
        text.append(f"{c.name}: {c.value:.2e} {c.tolerance}\n", style=None if c.ok else "bold red")
    if not all(c.ok for c in checks):
        text.append(failed, style="bold white on red")
    return text
