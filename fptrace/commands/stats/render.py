"""Terminal view and figure of `fptrace stats`: the massive activations, the LLM.int8() outlier
dimensions, each layer's top channels and the attention-sink heads, each under the thresholds
it was drawn with; the figure: per-layer channel maxima of the residual stream as a heatmap, and
each layer's largest |x| with the layers of massive activations marked."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.text import Text

from fptrace.commands.stats.result import Share, Stats
from fptrace.render.figures import pyplot
from fptrace.render.fit import Col, fit_table
from fptrace.render.tables import header
from fptrace.render.text import bullets, compact, visible

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def layers_text(layers: tuple[int, ...]) -> str:
    """0–3, 7, 9–11: runs of consecutive layers."""
    runs: list[list[int]] = []
    for x in layers:
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _shares(shares: tuple[Share, ...], token: bool) -> str:
    return ", ".join((repr(visible(s.text)) if token else str(s.value)) + f" ({s.share:.0%})"
                     for s in shares)


def section(title: str, body: RenderableType) -> RenderableType:
    """A bold title line (it wraps at the terminal's width, not the table's), then the body."""
    return Group(Text(title, style="bold"), body)


def summary(r: Stats) -> Text:
    t = Text(f"{r.prompts:,} prompt(s), {r.tokens:,} token positions", style="bold")
    if r.failed:
        t.append(f"; {r.failed} not counted", style="bold red")
    t.append("\nstatistics of every block's residual stream and of the input of its linear "
             "layers, per channel", style="dim")
    return t


def massive_table(r: Stats, width: int | None) -> RenderableType:
    s = r.settings
    title = (f"Massive activations: |x| > {s.massive_min:g} and ≥ {s.massive_ratio:g}× the "
             "median |x| of its hidden state (Sun et al., 2024)")
    if not r.massive:
        return section(title, Text("none: no entry of any block's output meets both "
                                   "thresholds\n", style="dim"))
    cols = (Col("channel", 0, "right"), Col("layers", 0), Col("largest", 0, "right"),
            Col("at layer", 2, "right"), Col("× median", 0, "right"),
            Col("prompts", 1, "right"), Col("positions", 1, wrap=True),
            Col("tokens", 1, wrap=True))
    rows = [[str(m.channel), layers_text(m.layers), compact(m.value), str(m.layer),
             compact(m.ratio), f"{m.prompt_share:.0%}", _shares(m.positions, False),
             Text(_shares(m.tokens, True))] for m in r.massive]
    return section(title, fit_table(cols, rows, width))


def outlier_table(r: Stats, width: int | None) -> RenderableType:
    s = r.settings
    need = math.ceil(s.outlier_layers * r.model.n_layers)
    title = (f"Outlier dimensions (LLM.int8()): |x| ≥ {s.outlier_min:g} at ≥ "
             f"{s.outlier_positions:.0%} of the positions of the attention or MLP input, in ≥ "
             f"{s.outlier_layers:.0%} of the layers (≥ {need} of {r.model.n_layers})")
    if not r.outliers:
        return section(title, Text("none\n", style="dim"))
    cols = (Col("channel", 0, "right"), Col("layers", 0, "right"), Col("which", 1, wrap=True),
            Col("share ≥ 6", 0, "right"), Col("|x| max", 0, "right"))
    rows = [[str(o.channel), str(len(o.layers)), layers_text(o.layers), f"{o.share:.1%}",
             compact(o.absmax)] for o in r.outliers]
    return section(title, fit_table(cols, rows, width))


def top_table(r: Stats, width: int | None) -> RenderableType:
    k = r.settings.top
    title = f"Top {k} channel(s) per layer by |x| max, residual stream (where the largest is)"
    by_layer: dict[int, list] = {}
    for c in r.top_channels:
        by_layer.setdefault(c.layer, []).append(c)
    cols = [Col("layer", 0, "right"), Col("channel", 0, "right"), Col("value", 0, "right"),
            Col("mean ± std", 3, "right"), Col("prompt", 2), Col("pos", 1, "right"),
            Col("token", 1)] + [Col(f"#{i}", 2 + i) for i in range(2, k + 1)]
    rows = []
    for layer, cs in sorted(by_layer.items()):
        c = cs[0]
        rows.append([str(layer), str(c.channel), compact(c.value),
                     f"{compact(c.mean)} ± {compact(c.std)}", Text(c.prompt), str(c.position),
                     Text(repr(visible(c.text)))]
                    + [f"{o.channel}: {compact(o.value)}" for o in cs[1:]]
                    + [""] * (k - len(cs)))
    return section(title, fit_table(cols, rows, width))


def sink_table(r: Stats, width: int | None) -> RenderableType:
    s = r.settings
    title = (f"Attention sinks: heads giving ≥ {s.sink_threshold:.0%} of their attention (from "
             f"the later positions) to one of the first {s.sink_positions} positions")
    if not r.sink_heads:
        return section(title, Text("not tallied (--no-sinks)\n", style="dim"))
    sinks = [h for h in r.sink_heads if h.sink]
    n_heads = len(r.sink_heads)
    if not sinks:
        top = max(r.sink_heads, key=lambda h: h.mass)
        return section(title, Text(
            f"none of the {n_heads} heads; the most concentrated: layer {top.layer} head "
            f"{top.head}, {top.mass:.0%} on position {top.position}\n", style="dim"))
    per_layer = r.model.n_heads
    by_layer: dict[int, list] = {}
    for h in sinks:
        by_layer.setdefault(h.layer, []).append(h)
    cols = (Col("layer", 0, "right"), Col("sinks", 0, "right"), Col("position", 0),
            Col("token there", 1), Col("mean share", 0, "right"),
            Col("heads (share)", 2, wrap=True))
    rows = []
    for layer, hs in sorted(by_layer.items()):
        positions = sorted({h.position for h in hs})
        there = {h.position: h for h in hs}  # the token found at each sink position
        rows.append([str(layer), f"{len(hs)}/{per_layer}", ", ".join(map(str, positions)),
                     Text(", ".join(f"{visible(there[p].text)!r} ({there[p].token_share:.0%})"
                                    for p in positions)),
                     f"{sum(h.mass for h in hs) / len(hs):.0%}",
                     " ".join(f"{h.head}:{h.mass:.2f}" for h in hs)])
    note = Text(f"{len(sinks)} of {n_heads} heads are sinks\n", style="dim")
    return section(title, Group(fit_table(cols, rows, width), note))


def experts_table(r: Stats, width: int | None) -> RenderableType:
    """Per mixture-of-experts block: the load of its least and most chosen experts, the
    imbalance, the experts never chosen and the router's mean entropy (nothing for a dense
    model)."""
    if not r.experts:
        return Group()
    n_experts = len(r.experts[0].load)
    cols = (Col("block", 0, "right"), Col("positions", 1, "right"), Col("min load", 0, "right"),
            Col("max load", 0, "right"), Col("max/mean", 0, "right"), Col("CV", 0, "right"),
            Col("entropy", 1, "right"), Col("never chosen", 0, wrap=True))
    rows = [[str(e.layer), f"{e.positions:,}", f"{min(e.load):,}", f"{max(e.load):,}",
             f"{e.max_over_mean:.2f}", f"{e.cv:.2f}", f"{e.entropy:.3f}",
             ", ".join(map(str, e.never_chosen)) or "none"] for e in r.experts]
    title = (f"Expert load: positions per expert of {n_experts}, per block (max/mean and CV: "
             f"1 and 0 when balanced; entropy: the router's mean, ln {n_experts} = "
             f"{math.log(n_experts):.3f} when uniform)")
    return section(title, fit_table(cols, rows, width))


def stats_view(r: Stats, width: int | None = 120) -> RenderableType:
    return Group(header(r.model), summary(r), massive_table(r, width), outlier_table(r, width),
                 top_table(r, width), sink_table(r, width), experts_table(r, width),
                 bullets(r.notes))


def stats_figure(r: Stats) -> tuple[Figure, dict]:
    """The channel maxima of the residual stream, layers × channels (log scale), and each
    layer's largest |x| with the layers of massive activations marked."""
    import numpy as np
    from matplotlib.colors import LogNorm

    plt = pyplot()
    rows = []
    for layer in r.statistics.layers:
        site = next((s for s in layer.sites if s.site == "resid_post"), None)
        rows.append(np.asarray(site.channels.absmax, dtype=float) if site is not None
                    else np.array([]))
    d = max((len(x) for x in rows), default=0)
    grid = np.full((len(rows), d), np.nan)
    for i, x in enumerate(rows):
        grid[i, :len(x)] = np.where(x > 0, x, np.nan)
    top = [float(np.nanmax(x)) if len(x) and np.isfinite(x).any() else math.nan
           for x in grid]
    massive_layers = sorted({l for m in r.massive for l in m.layers})
    series = {"absmax": grid.tolist(), "layer_max": top, "massive_layers": massive_layers,
              "massive_channels": [m.channel for m in r.massive]}
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, max(4.0, 0.16 * len(rows) + 2)),
                                 gridspec_kw={"width_ratios": [3, 1]}, constrained_layout=True)
    finite = grid[np.isfinite(grid)]
    if finite.size:
        im = ax.imshow(grid, aspect="auto", origin="lower", cmap="magma", interpolation="nearest",
                       norm=LogNorm(vmin=max(float(finite.min()), 1e-6),
                                    vmax=float(finite.max())))
        fig.colorbar(im, ax=ax, label="|x| max")
    ax.set_xlabel("channel")
    ax.set_ylabel("layer (block output)")
    ax.set_title(f"Residual stream: largest |x| per channel ({r.prompts} prompts)")
    y = list(range(len(top)))
    bx.plot(top, y, marker="o", ms=3, color="tab:blue", label="largest |x|")
    if massive_layers:
        bx.scatter([top[i] for i in massive_layers], massive_layers, color="tab:red", zorder=3,
                   label="massive activations")
    bx.set_xscale("log")
    bx.set_ylim(-0.5, len(top) - 0.5)
    bx.set_xlabel("|x| max")
    bx.set_title("Per layer")
    bx.legend(loc="lower right", fontsize=8)
    return fig, series
