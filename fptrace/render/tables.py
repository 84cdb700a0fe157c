"""Rich tables for `fptrace run`."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..results import ModelInfo, ShapeStep, Token, Trace
from .text import bar, norm, num, shape, visible


def header(info: ModelInfo) -> RenderableType:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
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
                    + (f"   d_mlp {info.d_mlp}" if info.d_mlp else "")),
        ("vocab", f"{info.vocab_size:,}   context {info.context_length or '?'}"),
        ("params", f"{info.n_params:,}" + ("   (LM head tied to embedding)"
                                           if info.tied_embeddings else "")),
        ("device", f"{info.device}   dtype {info.dtype}"),
        *([("placement", "; ".join(info.placement))] if info.placement else []),
        ("weights", info.source),
    ]
    for k, v in rows:
        grid.add_row(k, Text(v))
    title = "fptrace" + ("  [bold red]RANDOM WEIGHTS[/]" if info.random_weights else "")
    return Panel(grid, title=title, title_align="left", expand=False)


def token_table(toks: tuple[Token, ...], title: str = "Tokens") -> Table:
    """Position, id and text (whitespace made visible) of each token."""
    t = Table(title=title, title_justify="left")
    t.add_column("pos", justify="right")
    t.add_column("id", justify="right")
    t.add_column("text")
    for tok in toks:
        t.add_row(str(tok.position), str(tok.id), Text(visible(tok.text)))
    return t


def tokens(trace: Trace) -> RenderableType:
    return token_table(trace.tokens)


def _compress(steps: tuple[ShapeStep, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """Runs of blocks with the same shape become one 'blocks a–b' step."""
    out: list[tuple[str, tuple[int, ...]]] = []
    run: list[ShapeStep] = []

    def flush() -> None:
        if not run:
            return
        if len(run) == 1:
            out.append((run[0].label, run[0].shape))
        else:
            first, last = run[0].label.split()[-1], run[-1].label.split()[-1]
            out.append((f"blocks {first}–{last}, each", run[0].shape))
        run.clear()

    for s in steps:
        if s.point == "resid_post" and (not run or run[-1].shape == s.shape):
            run.append(s)
            continue
        flush()
        if s.point == "resid_post":
            run.append(s)
        else:
            out.append((s.label, s.shape))
    flush()
    return out


def shape_flow(trace: Trace) -> RenderableType:
    text = Text()
    for i, (label, s) in enumerate(_compress(trace.shapes)):
        if i:
            text.append("  →  ", style="dim")
        text.append(label + " ")
        text.append(shape(s), style="cyan")
    return Panel(text, title="Shape flow", title_align="left", expand=False)


def layers(trace: Trace, width: int = 120) -> RenderableType:
    """One row for the embedding and one per block. Below 125 columns the snippet column is
    left out (it stays in --json)."""
    rows = trace.layers
    top = max((l.resid_norm_last for l in rows if l.finite), default=0.0)
    with_snippet = width >= 125 and any(l.snippet for l in rows)
    t = Table(title="Residual stream per layer (last position; mean over positions where noted)",
              title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    t.add_column("layer", justify="right", no_wrap=True)
    t.add_column("‖resid‖", justify="right", no_wrap=True)
    t.add_column("", no_wrap=True, min_width=8)
    t.add_column("mean\n‖resid‖", justify="right", no_wrap=True)
    t.add_column("‖attn‖", justify="right", no_wrap=True)
    t.add_column("‖mlp‖", justify="right", no_wrap=True)
    t.add_column("‖Δ‖", justify="right", no_wrap=True)
    t.add_column("cos\nprev", justify="right", no_wrap=True)
    if with_snippet:
        t.add_column("first values", no_wrap=True)
    t.add_column("logit lens\ntop-1", no_wrap=True)
    t.add_column("p", justify="right")
    for l in rows:
        name = "embed" if l.layer is None else str(l.layer)
        style = None if l.finite else "bold red"
        if trace.first_nonfinite and name == trace.first_nonfinite.replace("block ", ""):
            name = "⚠ " + name
        cells: list[RenderableType | str] = [
            name, norm(l.resid_norm_last), Text(bar(l.resid_norm_last, top, 8), style="green"),
            norm(l.resid_norm_mean), norm(l.attn_norm_last), norm(l.mlp_norm_last),
            norm(l.added_norm_last), num(l.cos_prev, 3)]
        if with_snippet:
            cells.append(_snippet(l.snippet))
        cells += [Text(visible(l.lens_text)) if l.lens_text is not None else "—",
                  num(l.lens_prob, 3)]
        t.add_row(*cells, style=style)
    fn = trace.final_norm
    last = len(rows) - 2
    t.caption = (f"final_norm (applied to the stream after block {last}): ‖x‖ = "
                 f"{norm(fn.norm_last)}, first values {_snippet(fn.snippet)}")
    check = getattr(trace, "decomposition", None)
    if check is not None and not check.holds:
        t.caption += "\n— " + check.note()
    t.caption_justify = "left"
    return t


def _snippet(values: tuple[float, ...]) -> str:
    return " ".join(f"{x:+.2f}" for x in values)


def top_k(trace: Trace) -> RenderableType:
    t = Table(title=f"Top-{len(trace.top_k)} next tokens", title_justify="left")
    t.add_column("rank", justify="right")
    t.add_column("token")
    t.add_column("id", justify="right")
    t.add_column("prob", justify="right")
    t.add_column("", no_wrap=True)
    t.add_column("logit", justify="right")
    for tok in trace.top_k:
        t.add_row(str(tok.rank), Text(visible(tok.text)), str(tok.id), f"{tok.prob:.4f}",
                  Text(bar(tok.prob, 1.0, 10), style="magenta"), num(tok.logit, 3))
    return t


LEGEND = ("‖resid‖: norm of the residual stream at the last position; mean ‖resid‖: its mean "
          "over positions; ‖attn‖, ‖mlp‖: what attention and the MLP added at the last position; "
          "‖Δ‖: what the whole block added; cos prev: cosine to the previous row's stream; "
          "logit lens: final norm + LM head applied to that row's stream.")


def notes(trace: Trace) -> RenderableType:
    text = Text(LEGEND + "\n", style="dim")
    if trace.first_nonfinite:
        text.append(f"NaN/Inf first appears at {trace.first_nonfinite}\n", style="bold red")
    for n in trace.notes:
        text.append("• " + n + "\n", style="bold red" if n.startswith("RANDOM") else "dim")
    return text


def trace_view(trace: Trace, width: int = 120) -> RenderableType:
    return Group(header(trace.model), tokens(trace), shape_flow(trace), layers(trace, width),
                 top_k(trace), notes(trace))
