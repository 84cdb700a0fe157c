"""Terminal view and figure of `fptrace run`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from fptrace.commands.run.notes import TOKENIZED
from fptrace.render.figures import nan_if_none, pyplot
from fptrace.render.fit import Col, fit_table
from fptrace.render.routing import routing_table, top1_grid
from fptrace.render.tables import header, layers, token_table, top_k
from fptrace.render.text import duration, num, shape, visible
from fptrace.results import ShapeStep, Trace

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _lens_metrics(ax: Any, x: list, rows: Any, series: dict) -> None:
    """KL(final ‖ lens) and the lens's entropy per layer, on a second axis (nats)."""
    series["lens_kl"] = [nan_if_none(l.lens_kl) for l in rows]
    series["lens_entropy"] = [nan_if_none(l.lens_entropy) for l in rows]
    if any(l.lens_kl is not None for l in rows):
        kx = ax.twinx()
        kx.plot(x, series["lens_kl"], "k--", lw=1, label="KL(final ‖ lens)")
        kx.plot(x, series["lens_entropy"], ":", color="tab:gray", lw=1, label="lens entropy")
        kx.set_ylabel("nats")
        kx.legend(loc="center right", fontsize=8)


def trace_figure(trace: Trace) -> tuple[Figure, dict]:
    """Residual norms per layer, what attention and the MLP added, the logit-lens heatmap
    (layers × positions) and the top-k bar chart."""
    plt = pyplot()
    rows = trace.layers
    labels = ["emb"] + [str(l.layer) for l in rows[1:]]
    x = list(range(len(rows)))
    series: dict[str, Any] = {
        "layers": labels,
        "resid_norm_last": [l.resid_norm_last for l in rows],
        "resid_norm_mean": [l.resid_norm_mean for l in rows],
        # withheld (decomposition check failed): NaN, not drawn
        "attn_norm_last": [nan_if_none(l.attn_norm_last) for l in rows[1:]],
        "mlp_norm_last": [nan_if_none(l.mlp_norm_last) for l in rows[1:]],
        "added_norm_last": [nan_if_none(l.added_norm_last) for l in rows[1:]],
        "top_k": [(t.text, t.prob) for t in trace.top_k],
        "lens_prob": [[c.prob for c in row] for row in trace.lens_grid],
        "lens_text": [[c.text for c in row] for row in trace.lens_grid],
    }
    grid = bool(trace.lens_grid)
    fig = plt.figure(figsize=(15, 10 if grid else 7), constrained_layout=True)
    gs = fig.add_gridspec(2, 2, height_ratios=[1, 1.6] if grid else [1, 1])
    ax = fig.add_subplot(gs[0, 0])
    ax.plot(x, series["resid_norm_last"], marker="o", ms=3, label="last position")
    ax.plot(x, series["resid_norm_mean"], marker="s", ms=3, label="mean over positions")
    ax.set_title("‖residual stream‖ per layer")
    _lens_metrics(ax, x, rows, series)
    ax.set_xticks(x[:: max(1, len(x) // 16)], labels[:: max(1, len(x) // 16)])
    ax.set_xlabel("after layer")
    ax.legend()
    ax = fig.add_subplot(gs[0, 1])
    xb = x[1:]
    w = 0.4
    ax.bar([i - w / 2 for i in xb], series["attn_norm_last"], w, label="‖attn out‖")
    ax.bar([i + w / 2 for i in xb], series["mlp_norm_last"], w, label="‖mlp out‖")
    check = trace.decomposition
    if check is not None and not check.holds:
        ax.plot(xb, series["added_norm_last"], "k.", label="‖Δ‖ (the whole block)")
        ax.set_title("What each block added (last position)\n‖attn‖, ‖mlp‖ withheld for "
                     f"{len(check.withheld)} blocks: they do not add up to Δ", fontsize=9)
    else:
        ax.set_title("What each block added (last position)")
    ax.set_xticks(xb[:: max(1, len(xb) // 16)], labels[1:][:: max(1, len(xb) // 16)])
    ax.set_xlabel("block")
    ax.legend()
    if grid:
        ax = fig.add_subplot(gs[1, 0])
        probs = series["lens_prob"]
        im = ax.imshow(probs, aspect="auto", cmap="viridis", vmin=0, vmax=1, origin="lower")
        tok = {t.position: visible(t.text) for t in trace.tokens}
        cols = [tok.get(p, str(p)) for p in trace.lens_positions]
        ax.set_xticks(range(len(cols)), cols, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(len(labels))[:: max(1, len(labels) // 16)],
                      labels[:: max(1, len(labels) // 16)], fontsize=8)
        ax.set_xlabel("input position")
        ax.set_ylabel("layer")
        ax.set_title("Logit lens: top-1 token at each layer and position (colour: its p)")
        if len(cols) <= 16:
            for r, row in enumerate(series["lens_text"]):
                for c, text in enumerate(row):
                    ax.text(c, r, visible(text)[:8], ha="center", va="center", fontsize=6,
                            color="white" if probs[r][c] < 0.6 else "black")
        fig.colorbar(im, ax=ax, fraction=0.03)
        ax = fig.add_subplot(gs[1, 1])
    else:
        ax = fig.add_subplot(gs[1, :])
    names = [visible(t) for t, _ in series["top_k"]][::-1]
    ax.barh(range(len(names)), [p for _, p in series["top_k"]][::-1], color="tab:purple")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlim(0, 1)
    ax.set_title(f"Top-{len(names)} next tokens")
    ax.set_xlabel("probability")
    fig.suptitle(f"{trace.model.name}: {trace.prompt[:80]!r}"
                 + ("  (RANDOM WEIGHTS)" if trace.model.random_weights else ""))
    return fig, series


def tokens(trace: Trace, width: int | None = None) -> RenderableType:
    said = [trace.token_note] if trace.token_note else []
    if trace.tokenize_seconds is not None:
        said.append(TOKENIZED(time=duration(trace.tokenize_seconds)))
    return token_table(trace.tokens, width=width, note="\n".join(said) or None)


def positions(trace: Trace, width: int | None = None) -> RenderableType:
    """--all-positions: what the model predicted at every position, and the loss of the
    prompt (the mean cross-entropy of each position's prediction of the next token)."""
    rows = [[str(r.position), Text(visible(r.token.text)),
             Text(visible(r.actual.text)) if r.actual else "—", num(r.actual_prob, 4),
             "—" if r.actual_rank is None else f"{r.actual_rank:,}", num(r.loss, 2),
             Text(visible(r.predicted.text)), num(r.predicted.prob, 4)]
            for r in trace.positions]
    scored = sum(1 for r in trace.positions if r.loss is not None)
    caption = None if trace.mean_loss is None else (
        f"mean loss {trace.mean_loss:.3f} nats over {scored} predictions, perplexity "
        f"{trace.perplexity:.2f}: the loss training averages; the last position has no next "
        "token to score")
    return fit_table(POSITION_COLS, rows, width, title="Predictions at every position (a "
                     "causal LM scores the next token at each one)", title_justify="left",
                     caption=caption, caption_justify="left")


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


def notes(trace: Trace) -> RenderableType:
    legend = LEGEND if trace.engine != "llama.cpp" else LLAMACPP_ROWS + LEGEND[LEGEND.index(
        " ‖resid‖"):]
    text = Text(legend + "\n", style="dim")
    if trace.first_nonfinite:
        text.append(f"NaN/Inf first appears at {trace.first_nonfinite}\n", style="bold red")
    for n in trace.notes:
        text.append("• " + n + "\n", style="bold red" if n.startswith("RANDOM") else "dim")
    return text


def trace_view(trace: Trace, width: int | None = 120) -> RenderableType:
    """Everything `run` prints; width None (--wide) shows every column."""
    parts = [header(trace.model), tokens(trace, width), shape_flow(trace), layers(trace, width)]
    if trace.routing is not None:  # a mixture of experts (a dense model's view is unchanged)
        parts.append(routing_table(trace.routing, width))
        if trace.all_positions:
            parts.append(top1_grid(trace.routing, trace.tokens, width))
    if trace.positions:
        parts.append(positions(trace, width))
    return Group(*parts, top_k(trace, width), notes(trace))


POSITION_COLS = (Col("pos", 0, "right"), Col("token", 0), Col("next token", 0),
                 Col("p(next)", 0, "right"), Col("rank", 1, "right"),
                 Col("loss\n(nats)", 0, "right"), Col("predicted\ntop-1", 2),
                 Col("p", 2, "right"))


LLAMACPP_ROWS = ("Rows: llama.cpp's own tensors: the embed row is its embd, block k's row is "
                 "its l_out-k, the stream after block k; attention and the MLP added are its "
                 "attn_out-k and ffn_out-k.")
LEGEND = ("Rows: the embed row is transformers' hidden_states[0]; block k's row is the stream "
          "after block k, hidden_states[k + 1] (the last entry of hidden_states has the final "
          "norm applied: see below the table). ‖resid‖: norm of the residual stream at the last position; mean ‖resid‖: its mean "
          "over positions; ‖attn‖, ‖mlp‖: what attention and the MLP added at the last position; "
          "‖Δ‖: what the whole block added; cos prev: cosine to the previous row's stream; "
          "logit lens: final norm + LM head applied to that row's stream; rank of final: where the "
          "model's final top-1 token ranks in that row's lens; KL: KL(final ‖ lens) and H: the "
          "lens's entropy, in nats.")
