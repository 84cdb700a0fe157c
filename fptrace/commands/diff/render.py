"""Rich renderables for `fptrace diff`."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.text import Text

from fptrace.commands.diff.result import (
    DeepDiff,
    DiffSide,
    Emulation,
    ErrorShare,
    StatsDiff,
    TraceDiff,
)
from fptrace.render.fit import Col, RowStyle, fit_table
from fptrace.render.text import bullets, compact, norm, num, visible

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _side(s: DiffSide) -> Text:
    text = Text(f"{s.label}: ", style="bold")
    quant = f", {s.quantization} weight-only" if s.quantization else ""
    if s.quantization and s.quantized_weights is not None:
        quant += f" ({s.quantized_weights} weights)"
    text.append(f"{s.model} ({s.dtype}{quant} on {s.device})" + ("  RANDOM WEIGHTS"
                                                                  if s.random_weights else ""))
    text.append(f"  {s.prompt!r}  [{len(s.tokens)} tokens: "
                + " ".join(visible(t) for _, t in s.tokens) + "]", style="dim")
    return text


LAYER_COLS = (Col("layer", 0, "right"), Col("‖a‖", 0, "right"), Col("‖b‖", 0, "right"),
              Col("‖a − b‖ / ‖a‖", 0, "right"), Col("cos", 1, "right"),
              Col("lens top-1 a", 2), Col("lens top-1 b", 2), Col("≠", 2))
# with --deep: the lens KL, the stream's error channels, the block's worst point
DEEP_COLS = (Col("lens KL", 0, "right"), Col("worst point", 0), Col("its rel", 0, "right"),
             Col("top-5 error channels", 1))


def _rel(x: float | None, tolerance: float, nonfinite: bool = False) -> Text:
    over = nonfinite or x is None or not x <= tolerance
    return Text("NaN/Inf" if nonfinite else "—" if x is None else f"{x:.2e}",
                style="bold red" if over else "")


def shares(items: tuple[ErrorShare, ...], least: float = 0.05) -> str:
    """`407 (62%), 12 (9%)`: the heads or channels carrying at least `least` of the error
    (all of those with NaN/Inf, which have no share)."""
    if items and items[0].share is None:
        return "NaN/Inf: " + ", ".join(str(s.index) for s in items)
    return ", ".join(f"{s.index} ({s.share:.0%})" for s in items if s.share >= least)


def _top(items: tuple[ErrorShare, ...]) -> str:
    """`507:13% 17:6% ...`: channels and their share of ‖a − b‖²."""
    if items and items[0].share is None:
        return "NaN/Inf: " + " ".join(str(s.index) for s in items)
    return " ".join(f"{s.index}:{s.share:.0%}" for s in items)


def _deep_cells(deep: DeepDiff, layer: int | None) -> list:
    lens = next((r for r in deep.lens if r.layer == layer), None)
    blk = next((b for b in deep.blocks if b.layer == layer), None)
    worst = next((p for p in blk.points if p.point == blk.worst), None) if blk else None
    kl = "—" if lens is None or lens.kl is None else \
        "0" if lens.kl == 0 else f"{lens.kl:.2e}"
    if worst is not None and worst.rel == 0:
        point, rel = "all 0", ""
    else:
        point = worst.point if worst else ""
        rel = _rel(worst.rel, deep.tolerance, worst.nonfinite) if worst else ""
    return [kl, point, rel, _top(lens.channels) if lens else ""]


def layers_table(d: TraceDiff, width: int | None) -> RenderableType:
    rows = []
    for r in d.layers:
        over = r.rel_diff is not None and not r.rel_diff <= d.tolerance
        rel = "—" if r.rel_diff is None else f"{r.rel_diff:.2e}"
        rows.append(RowStyle([
            "embed" if r.layer is None else str(r.layer), norm(r.norm_a), norm(r.norm_b),
            Text(rel, style="bold red" if over else ""), num(r.cos, 6),
            Text(visible(r.lens_a or "—")), Text(visible(r.lens_b or "—")),
            "" if r.lens_same else "≠"] + (_deep_cells(d.deep, r.layer) if d.deep else []),
            None))
    cols = LAYER_COLS
    if d.deep:  # the points' columns come before the norms, the cosine and the lens tokens
        cols = tuple(replace(c, priority=c.priority + (2 if c.priority else 0) + (
            2 if c.header in ("‖a‖", "‖b‖") else 0)) for c in LAYER_COLS) + DEEP_COLS
    return fit_table(cols, rows, width, title="The last position's stream, layer by layer "
                     f"(tolerance on ‖a − b‖ / ‖a‖: {d.tolerance_reason})", title_justify="left")


POINT_COLS = (Col("point", 0), Col("rel", 0, "right"), Col("max |a − b|", 1, "right"),
              Col("from", 1), Col("their rel", 0, "right"), Col("carried by", 2),
              Col("source", 2))


def points_table(deep: DeepDiff, layer: int, width: int | None) -> RenderableType:
    """Every point of one block: its relative difference over all positions, its inputs'."""
    blk = next(b for b in deep.blocks if b.layer == layer)
    rows = []
    for p in blk.points:
        what = ("heads " if p.heads else "channels ") + shares(p.heads or p.channels) \
            if (p.heads or p.channels) else ""
        rows.append([p.point, _rel(p.rel, deep.tolerance, p.nonfinite),
                     num(p.max_abs, 6) if not p.nonfinite else "—",
                     ", ".join(p.inputs) or "token ids",
                     "—" if p.inputs_rel is None else f"{p.inputs_rel:.2e}", what,
                     "hooked" if p.recorded else "recomputed"])
    return fit_table(POINT_COLS, rows, width, title=f"Block {layer}, point by point (every "
                     "position; rel = ‖a − b‖ / ‖a‖)", title_justify="left")


TOP_COLS = (Col("token", 0), Col("id", 2, "right"), Col("rank a", 0, "right"),
            Col("rank b", 0, "right"), Col("", 1), Col("p a", 0, "right"),
            Col("p b", 0, "right"))


def top_table(d: TraceDiff, width: int | None) -> RenderableType:
    rows = []
    for t in d.top_k:
        move = "" if t.rank_a == t.rank_b else ("new in b" if t.rank_a is None else
                                                "gone in b" if t.rank_b is None else
                                                "↑" if t.rank_b < t.rank_a else "↓")
        rows.append([Text(visible(t.text)), str(t.id), "—" if t.rank_a is None else str(t.rank_a),
                     "—" if t.rank_b is None else str(t.rank_b), move, num(t.prob_a, 4),
                     num(t.prob_b, 4)])
    return fit_table(TOP_COLS, rows, width, title="Top-k of both, with rank changes",
                     title_justify="left")


def _blocks(deep: DeepDiff) -> str:
    """`blocks 3–5`, `block 7`, `blocks 0, 4, 8–9`: the blocks compared point by point."""
    runs: list[list[int]] = []
    for b in deep.layers:
        if runs and runs[-1][-1] == b - 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    text = ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
    return ("block " if len(deep.layers) == 1 else "blocks ") + text


def deep_verdict(deep: DeepDiff) -> Text | None:
    if not deep.compared:
        return None
    if deep.parted is None:
        return Text(f"✓ every point of {_blocks(deep)} agrees within {deep.tolerance:g}",
                    style="bold green")
    return Text(f"✗ the runs part at {deep.parted.sentence}", style="bold red")


def verdict(d: TraceDiff) -> Text:
    if d.within:
        points = f" and every point of {_blocks(d.deep)}" if d.deep and d.deep.compared else ""
        return Text(f"✓ a and b agree within {d.tolerance:g} at every layer{points}",
                    style="bold green")
    if not d.comparable:
        return Text("✗ the streams could not be compared at every layer (see the notes)",
                    style="bold yellow")
    if d.first_over is None:  # the streams agree; a point inside a block does not (--deep)
        return Text(f"✓ the streams agree within {d.tolerance:g} at every layer",
                    style="bold green")
    worst = max((r.rel_diff for r in d.layers if r.rel_diff is not None), default=0.0)
    return Text(f"✗ a and b differ: first over {d.tolerance:g} at {d.first_over}; largest "
                f"relative difference {worst:.2e}", style="bold red")


def _chosen(experts: tuple[int, ...], weights: tuple[float, ...]) -> str:
    return ", ".join(f"{e} ({w:.3f})" for e, w in zip(experts, weights, strict=False))


def _parted(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.2e}"


def routing_table(d: TraceDiff, width: int | None) -> RenderableType:
    """Where the two runs' routers chose different experts (nothing without routing)."""
    r = d.routing
    if r is None:
        return Group()
    if r.first is None:
        return Text(f"Routing: the same experts at all {r.compared:,} block-positions\n",
                    style="bold green")
    f = r.first
    title = Text(f"Routing flips: {r.flipped:,} of {r.compared:,} block-positions chose other "
                 f"experts; the first at block {f.layer}, position {f.position} "
                 f"({visible(f.text)!r}), where the last position's streams part by "
                 f"{_parted(r.parted_before)} entering the block and {_parted(r.parted_at)} "
                 "leaving it",
                 style="bold")
    cols = (Col("block", 0, "right"), Col("position", 0, "right"), Col("token", 1),
            Col("a: experts (weights)", 0, wrap=True), Col("b: experts (weights)", 0, wrap=True))
    rows = [[str(x.layer), str(x.position), visible(x.text), _chosen(x.experts_a, x.weights_a),
             _chosen(x.experts_b, x.weights_b)] for x in r.flips]
    more = [] if len(r.flips) == r.flipped else \
        [Text(f"(the first {len(r.flips)} of {r.flipped:,} listed)", style="dim")]
    return Group(title, fit_table(cols, rows, width), *more)


def _sci(x: float | None) -> str:
    return "—" if x is None else f"{x:.2e}"


def emulation_table(d: TraceDiff, em: Emulation, width: int | None) -> RenderableType:
    """--emulate: each block's error to llama.cpp with none of its numerics, then each step
    added (a column a rung), with the largest and the median over the blocks."""
    cols = (Col("layer", 0, "right"), *(Col(r.label, 0, "right") for r in em.rungs))
    rows = [["embed" if r.layer is None else str(r.layer),
             *("—" if rung.rel[i] is None else f"{rung.rel[i]:.2e}" for rung in em.rungs)]
            for i, r in enumerate(d.layers)]
    rows.append(["largest", *(_sci(r.worst) for r in em.rungs)])
    rows.append(["median", *(_sci(r.median) for r in em.rungs)])
    if any(r.alone for r in em.rungs):  # each block fed llama.cpp's own input
        rows.append(["alone, largest", *(_sci(r.alone_worst) for r in em.rungs)])
        rows.append(["alone, median", *(_sci(r.alone_median) for r in em.rungs)])
    fall = "" if em.fall is None else f"; the largest falls {em.fall:.1f}× with every step"
    if em.fall_alone is not None:
        fall += f", {em.fall_alone:.1f}× for a block alone (fed llama.cpp's own input)"
    return fit_table(cols, rows, width, title="‖transformers − llama.cpp‖ / ‖transformers‖ of "
                     "the last position's stream, llama.cpp's numerics emulated step by step "
                     f"(K/V cache {em.cache}, attention {em.kernel}){fall}",
                     title_justify="left")


def diff_view(d: TraceDiff, width: int | None = 120) -> RenderableType:
    notes = bullets(d.notes + (d.deep.notes if d.deep else ()))
    parts: list[RenderableType] = [_side(d.a), _side(d.b), layers_table(d, width)]
    if d.routing is not None:
        parts.append(routing_table(d, width))
    if d.emulation is not None:
        parts.append(emulation_table(d, d.emulation, width))
    if d.deep and d.deep.parted:
        parts.append(points_table(d.deep, d.deep.parted.layer, width))
    parts += [top_table(d, width), notes, verdict(d)]
    if d.deep and not d.within and (line := deep_verdict(d.deep)) is not None:
        parts.append(line)
    return Group(*parts)


def deep_figure(d: TraceDiff) -> tuple[Figure, dict]:
    """diff --deep as a heatmap: blocks × points, log10 of the relative difference (NaN/Inf in
    black), the point where the runs part circled."""
    import math

    from fptrace.render.figures import pyplot

    plt = pyplot()
    deep = d.deep
    assert deep is not None  # drawn for diff --deep only
    points = list(deep.points)
    grid: list[list[float]] = []
    for blk in deep.blocks:
        rels = {p.point: p for p in blk.points}
        row = []
        for p in points:
            r = rels.get(p)
            row.append(math.nan if r is None else math.inf if r.nonfinite else
                       math.nan if r.rel is None else r.rel)
        grid.append(row)
    series = {"points": points, "layers": list(deep.layers), "rel": grid,
              "tolerance": deep.tolerance}
    shown = [[math.log10(max(x, 1e-12)) if math.isfinite(x) else math.nan for x in row]
             for row in grid]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(points) + 2),
                                    max(3.0, 0.22 * len(grid) + 2)), constrained_layout=True)
    cmap = plt.get_cmap("magma_r").with_extremes(bad="black")
    im = ax.imshow(shown, cmap=cmap, vmin=-8, vmax=0, aspect="auto", origin="lower",
                   interpolation="nearest")
    ax.set_xticks(range(len(points)), points, rotation=60, ha="right")
    ax.set_yticks(range(len(grid)), [str(b) for b in deep.layers])
    ax.set_ylabel("block")
    if deep.parted is not None:
        x, y = points.index(deep.parted.point), list(deep.layers).index(deep.parted.layer)
        ax.plot([x], [y], marker="o", markersize=14, markerfacecolor="none",
                markeredgecolor="#00a0ff", markeredgewidth=2)
    ax.set_title(f"log10 ‖a − b‖ / ‖a‖ at each point (tolerance {deep.tolerance:g}; black: "
                 "NaN/Inf)")
    fig.colorbar(im, ax=ax)
    return fig, series


def stats_diff_view(d: StatsDiff, width: int | None = 120) -> RenderableType:
    """`diff --stats`: the channels that moved most, then each site's median and largest move."""
    head = Text(f"a: {d.a}  ({d.model_a}, {d.prompts_a} prompts)\nb: {d.b}  ({d.model_b}, "
                f"{d.prompts_b} prompts)", style="bold")
    cols = (Col("layer", 0, "right"), Col("site", 0), Col("channel", 0, "right"),
            Col("|x| max a", 0, "right"), Col("|x| max b", 0, "right"),
            Col("change", 0, "right"), Col("mean a → b", 1, "right"),
            Col("std a → b", 2, "right"))
    rows = [["final" if m.layer is None else str(m.layer), m.site, str(m.channel),
             compact(m.absmax_a), compact(m.absmax_b), f"{m.change:.1%}",
             f"{compact(m.mean_a)} → {compact(m.mean_b)}",
             f"{compact(m.std_a)} → {compact(m.std_b)}"] for m in d.channels]
    moved = fit_table(cols, rows, width, title="The channels whose |x| max moved most: |b − a| "
                      "/ max(a, 1% of the site's largest)", title_justify="left")
    site_cols = (Col("layer", 0, "right"), Col("site", 0), Col("median change", 0, "right"),
                 Col("largest", 0, "right"), Col("channel", 0, "right"))
    site_rows = [["final" if s.layer is None else str(s.layer), s.site, f"{s.median_change:.1%}",
                  f"{s.max_change:.1%}", str(s.channel)] for s in d.sites]
    sites = fit_table(site_cols, site_rows, width, title="Per site", title_justify="left")
    return Group(head, moved, sites, bullets(d.notes))
