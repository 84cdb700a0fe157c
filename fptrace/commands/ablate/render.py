"""Rich renderables and the figure of `fptrace ablate`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.text import Text

from fptrace.addresses import Head
from fptrace.commands.ablate.result import AblatedRun, Ablation
from fptrace.render.figures import pyplot
from fptrace.render.fit import Col, fit_table
from fptrace.render.tables import check_lines, header
from fptrace.render.text import bullets, visible

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _mode(a: Ablation) -> str:
    experts = any(r.experts for r in a.runs)
    if a.mode == "zero" and experts:
        return "its output set to zero (an expert: taken out of its router's choice)"
    if a.mode == "zero":
        return "its output set to zero"
    where = f"the {a.mean_positions} positions of " + ("the prompt" if a.mean_over is None
                                                        else a.mean_over)
    return f"its output set to its mean over {where}"


def summary(a: Ablation) -> Text:
    t = Text(f"Target {visible(a.target.text)} (id {a.target.id}): logit {a.clean_logit:.3f}, "
             f"p = {a.target.prob:.4f} in the clean run", style="bold")
    t.append(f"\neach run removes the parts named, {_mode(a)}; total: the logit's change with "
             "later blocks free to react; direct: the change of the parts' own writes through "
             "the final norm and LM head (attribute); indirect: total − direct "
             f"({a.forward_passes} forward passes)")
    return t


RUN_COLS = (Col("removed", 0, wrap=True, min_width=16), Col("logit", 0, "right"),
            Col("total", 0, "right"), Col("direct", 0, "right"), Col("indirect", 1, "right"),
            Col("p", 0, "right"), Col("Δp", 2, "right"), Col("rank", 1, "right"),
            Col("top-1", 1))


def _cell(x: float | None) -> str:
    return "—" if x is None else f"{x:+.3f}"


def _run_row(r: AblatedRun) -> list:
    return [Text(", ".join(r.parts)), f"{r.logit:.3f}", _cell(r.logit_change), _cell(r.direct),
            _cell(r.indirect), f"{r.prob:.4f}", f"{r.prob_change:+.4f}", str(r.rank),
            Text(visible(r.top.text))]


def runs_table(runs: tuple[AblatedRun, ...], title: str, width: int | None) -> RenderableType:
    return fit_table(RUN_COLS, [_run_row(r) for r in runs], width, title=title,
                     title_justify="left")


def _shade(x: float, top: float, mark: bool) -> str:
    level = int(round(min(abs(x) / top, 1.0) * 200)) if top > 0 else 0
    style = (f"on rgb(255,{255 - level},{255 - level})" if x < 0 else
             f"on rgb({255 - level},{255 - level},255)") if level else ""
    return (style + " bold").strip() if mark else style


def grid_table(a: Ablation, width: int | None) -> RenderableType:
    """Blocks × heads (and the MLP column) of the target's logit change, the largest marked ★."""
    n_heads = len(a.head_grid[0]) if a.head_grid else 0
    cols = [Col("block", 0, "right")] + [Col(f"h{h}", 0, "right") for h in range(n_heads)]
    if a.mlp_column:
        cols.append(Col("MLP", 0, "right"))
    heads = sorted(((abs(v), str(Head(l, h))) for l, row in enumerate(a.head_grid)
                    for h, v in enumerate(row)), reverse=True)[:5]
    mlps = sorted(((abs(v), f"mlp {l}") for l, v in enumerate(a.mlp_column)), reverse=True)[:3]
    marked = {name for _, name in heads + mlps}
    values = [v for row in a.head_grid for v in row] + list(a.mlp_column)
    top = max((abs(v) for v in values), default=0.0)
    rows = []
    for l in range(max(len(a.head_grid), len(a.mlp_column))):
        cells: list[Any] = [str(l)]
        items = [(str(Head(l, h)), v) for h, v in enumerate(a.head_grid[l])] if a.head_grid else []
        if a.mlp_column:
            items.append((f"mlp {l}", a.mlp_column[l]))
        for label, v in items:
            mark = label in marked
            cells.append(Text(f"{v:+.3f}" + ("★" if mark else " "), style=_shade(v, top, mark)))
        rows.append(cells)
    what = " and MLP" if a.mlp_column and a.head_grid else ("MLP" if a.mlp_column else "")
    stars = ", ".join(x for x, on in (("the 5 largest heads", a.head_grid),
                                      ("the 3 largest MLPs", a.mlp_column)) if on)
    title = (f"The target's logit change with one {'head' if a.head_grid else ''}{what} "
             f"removed (★: {stars})")
    return Group(Text(title), fit_table(cols, rows, width))


def ablate_view(a: Ablation, width: int | None = 120) -> RenderableType:
    parts: list[Any] = [header(a.model), summary(a)]
    if a.runs:
        parts.append(runs_table(a.runs, "The parts named, alone and together (logits)", width))
    if a.head_grid or a.mlp_column:
        parts.append(grid_table(a, width))
        parts.append(runs_table(a.largest, f"The {len(a.largest)} largest effects, total next "
                                "to direct (logits)", width))
    parts += [bullets(a.notes), check_lines(a.checks, "THE ABLATED RUNS DO NOT CHECK OUT: do "
                                            "not trust the numbers above.")]
    return Group(*parts)


def ablate_figure(a: Ablation) -> tuple[Figure, dict]:
    """The ablation grid as a heatmap (blocks × heads, and the MLP column), or the bars of the
    named parts' total and direct effects."""
    plt = pyplot()
    series: dict = {"head_grid": [list(r) for r in a.head_grid],
                    "mlp_column": list(a.mlp_column),
                    "runs": [{"parts": list(r.parts), "total": r.logit_change,
                              "direct": r.direct} for r in a.runs]}
    target = visible(a.target.text)
    if a.head_grid or a.mlp_column:
        grid = [list(r) + ([a.mlp_column[l]] if a.mlp_column else [])
                for l, r in enumerate(a.head_grid)] if a.head_grid else \
            [[v] for v in a.mlp_column]
        lim = max((abs(v) for row in grid for v in row), default=0.0) or 1.0
        fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(grid[0]) + 3),
                                        max(4.0, 0.22 * len(grid) + 2)),
                               constrained_layout=True)
        im = ax.imshow(grid, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto", origin="lower")
        labels = [f"h{h}" for h in range(len(a.head_grid[0]))] if a.head_grid else []
        ax.set_xticks(range(len(grid[0])), labels + (["MLP"] if a.mlp_column else []))
        ax.set_ylabel("block")
        ax.set_title(f"Logit change of {target!r} with one part removed ({a.mode}; red: down)")
        fig.colorbar(im, ax=ax)
    else:
        fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(a.runs) + 2), 4.5),
                               constrained_layout=True)
        x = range(len(a.runs))
        w = 0.4
        ax.bar([i - w / 2 for i in x], [r.logit_change for r in a.runs], w, label="total")
        ax.bar([i + w / 2 for i in x], [math.nan if r.direct is None else r.direct
                                        for r in a.runs], w, label="direct")
        ax.set_xticks(list(x), [", ".join(r.parts) for r in a.runs], rotation=30, ha="right")
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_ylabel(f"logit change of {target!r}")
        ax.legend()
    fig.suptitle(f"{a.model.name}: ablation ({a.mode})"
                 + ("  (RANDOM WEIGHTS)" if a.model.random_weights else ""))
    return fig, series
