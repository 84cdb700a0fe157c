"""Figures (matplotlib, headless): the figure functions return the Figure and the exact series
they plotted, so tests can check that every plotted number comes from the result."""

from __future__ import annotations

import math

import os
from typing import Any

from ..errors import BadInput
from ..results import Explanation, Trace
from .text import visible


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _lens_metrics(ax: Any, x: list, rows: Any, series: dict) -> None:
    """KL(final ‖ lens) and the lens's entropy per layer, on a second axis (nats)."""
    series["lens_kl"] = [_nan(l.lens_kl) for l in rows]
    series["lens_entropy"] = [_nan(l.lens_entropy) for l in rows]
    if any(l.lens_kl is not None for l in rows):
        kx = ax.twinx()
        kx.plot(x, series["lens_kl"], "k--", lw=1, label="KL(final ‖ lens)")
        kx.plot(x, series["lens_entropy"], ":", color="tab:gray", lw=1, label="lens entropy")
        kx.set_ylabel("nats")
        kx.legend(loc="center right", fontsize=8)


def _mpl() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    return plt


def check_path(path: str, what: str = "--plot") -> str:
    """The format named by the extension, or one clear error (before any work is done)."""
    from ..atomic import check_target

    check_target(path, what, "trace.png")
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    formats = ("png", "svg", "pdf", "jpg", "jpeg", "webp")
    if ext not in formats:
        raise BadInput(f"{what} {path}: the extension does not name an image format; use "
                       + ", ".join("." + f for f in formats))
    return ext


def save(fig: Any, path: str) -> None:
    """Write the figure atomically (see atomic.py): a failure never leaves half a file."""
    from ..atomic import write_atomic

    ext = check_path(path)
    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp, format=ext, dpi=110,
                                                   bbox_inches="tight"), "." + ext)
    finally:
        _mpl().close(fig)


def trace_figure(trace: Trace) -> tuple[Any, dict]:
    """Residual norms per layer, what attention and the MLP added, the logit-lens heatmap
    (layers × positions) and the top-k bar chart."""
    plt = _mpl()
    rows = trace.layers
    labels = ["emb"] + [str(l.layer) for l in rows[1:]]
    x = list(range(len(rows)))
    series: dict[str, Any] = {
        "layers": labels,
        "resid_norm_last": [l.resid_norm_last for l in rows],
        "resid_norm_mean": [l.resid_norm_mean for l in rows],
        # withheld (decomposition check failed): NaN, not drawn
        "attn_norm_last": [_nan(l.attn_norm_last) for l in rows[1:]],
        "mlp_norm_last": [_nan(l.mlp_norm_last) for l in rows[1:]],
        "added_norm_last": [_nan(l.added_norm_last) for l in rows[1:]],
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


def attention_figure(e: Explanation) -> tuple[Any, dict]:
    """Every head's attention weights at the explained layer, one heatmap each."""
    plt = _mpl()
    heads = [m for m in e.head_weights]
    if not heads:
        raise BadInput("no attention weights to plot (explain was run without all heads)")
    n = len(heads)
    cols = min(n, 4 if n <= 8 else 6)
    rows = (n + cols - 1) // cols
    T = len(heads[0].labels)
    size = 2.2 if T <= 12 else 3.0
    fig, axes = plt.subplots(rows, cols, figsize=(cols * size + 1, rows * size + 1),
                             squeeze=False, constrained_layout=True)
    series = {"heads": [m.head for m in heads], "weights": [[list(r) for r in m.rows]
                                                            for m in heads]}
    for k, ax in enumerate(axes.flat):
        if k >= n:
            ax.axis("off")
            continue
        m = heads[k]
        ax.imshow(series["weights"][k], cmap="magma", vmin=0, vmax=1)
        ax.set_title(f"head {m.head}", fontsize=9)
        if T <= 24:
            ax.set_xticks(range(T), [visible(x) for x in m.labels], rotation=90, fontsize=6)
            ax.set_yticks(range(T), [visible(x) for x in m.labels], fontsize=6)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(f"{e.model.name}, block {e.layer}: attention weights (row: query, column: key)")
    return fig, series


def attribution_figure(a: Any) -> tuple[Any, dict]:
    """Per-block bars (attention and MLP, in logits) and the layer × head heatmap."""
    plt = _mpl()
    series = {"layers": [l.layer for l in a.layers], "attn": [l.attn for l in a.layers],
              "mlp": [l.mlp for l in a.layers],
              "heads": [list(r) for r in a.head_grid]}
    fig, (ax, hx) = plt.subplots(1, 2, figsize=(15, 6), constrained_layout=True)
    x = series["layers"]
    w = 0.4
    ax.bar([i - w / 2 for i in x], series["attn"], w, label="attention")
    ax.bar([i + w / 2 for i in x], series["mlp"], w, label="MLP")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xlabel("block")
    ax.set_ylabel("logits")
    ax.set_title("What each block added to the target's logit")
    ax.legend()
    split = [r for r in series["heads"] if r]
    if split and all(len(r) == len(split[0]) for r in split):
        grid = [r if r else [math.nan] * len(split[0]) for r in series["heads"]]
        lim = max(abs(v) for r in split for v in r) or 1.0
        im = hx.imshow(grid, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
        hx.set_xlabel("head")
        hx.set_ylabel("block")
        hx.set_title("Per head (logits; red: down, blue: up)")
        fig.colorbar(im, ax=hx)
    else:
        hx.axis("off")
    target = visible(a.target.text) + ("" if a.versus is None
                                       else f" − {visible(a.versus.text)}")
    fig.suptitle(f"{a.model.name}: direct logit attribution of {target!r}"
                 + ("  (RANDOM WEIGHTS)" if a.model.random_weights else ""))
    return fig, series


def patch_figure(r: Any) -> tuple[Any, dict]:
    """The causal-tracing heatmap: layers × positions, the target's restored probability."""
    plt = _mpl()
    series = {"grid": [list(row) for row in r.grid], "p_clean": r.p_clean,
              "p_corrupt": r.p_corrupt, "tokens": [t.text for t in r.tokens]}
    T = len(r.tokens)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * T + 2), max(4.0, 0.18 * len(r.grid) + 2)),
                           constrained_layout=True)
    im = ax.imshow(series["grid"], cmap="Purples", vmin=0, vmax=max(r.p_clean, 1e-6),
                   aspect="auto", origin="lower")
    ax.set_xticks(range(T), [visible(t) for t in series["tokens"]], rotation=45, ha="right")
    ax.set_ylabel("layer")
    what = {"resid": "residual stream", "attn": "attention output", "mlp": "MLP output"}[r.what]
    ax.set_title(f"Restoring the {what}: p({visible(r.target.text)}) "
                 f"(clean {r.p_clean:.3f}, corrupted {r.p_corrupt:.3f})")
    fig.colorbar(im, ax=ax)
    return fig, series
