"""Rich renderables for `fptrace patch`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.text import Text

from fptrace.commands.patch.result import PatchResult
from fptrace.render.figures import pyplot
from fptrace.render.fit import Col, fit_table
from fptrace.render.tables import header
from fptrace.render.text import bullets, visible

if TYPE_CHECKING:
    from matplotlib.figure import Figure

WHAT = {"resid": "the block's output stream", "attn": "what attention added",
        "mlp": "what the MLP added"}


def summary(r: PatchResult) -> Text:
    t = Text(f"Target {visible(r.target.text)} (id {r.target.id}): p = {r.p_clean:.4f} clean, "
             f"{r.p_corrupt:.4f} corrupted", style="bold")
    if r.corruption == "noise":
        where = ", ".join(f"{i} {visible(r.tokens[i].text)}" for i in r.subject_positions)
        t.append(f"\ncorruption: Gaussian noise on the embeddings of {r.subject!r} (positions "
                 f"{where}), σ = {r.noise_std:.4g} = {r.noise_scale:g} × the embedding's "
                 f"standard deviation, seed {r.seed}")
    else:
        t.append("\ncorruption: the prompt " + " ".join(visible(x.text) for x in r.corrupt_tokens))
    span = "" if r.window == 1 else f" of {r.window} layers around it"
    t.append(f"\neach cell: the target's probability when the corrupted run gets {WHAT[r.what]} "
             f"at that layer{span} and position back from the clean run ({r.forward_passes} "
             "forward passes)")
    return t


def _shade(p: float, best: bool) -> str:
    level = int(round(min(max(p, 0.0), 1.0) * 255))
    style = f"on rgb({255 - level // 2},{255},{255 - level})" if level else ""
    return (style + " bold").strip() if best else style


def grid_table(r: PatchResult, width: int | None) -> RenderableType:
    T = len(r.tokens)
    key = set(r.subject_positions) | {T - 1}
    cols = [Col("layer", 0, "right")] + [
        Col(Text(f"{i} {visible(tok.text)}"), 0 if i in key else 1, "right")
        for i, tok in enumerate(r.tokens)]
    best = {(c.layer, c.position) for c in r.best}
    rows = []
    for layer, probs in enumerate(r.grid):
        rows.append([str(layer)] + [Text(f"{p:.3f}" + ("★" if (layer, i) in best else " "),
                                         style=_shade(p, (layer, i) in best))
                                    for i, p in enumerate(probs)])
    return fit_table(cols, rows, width, title="Restored probability of the target (★: the best "
                     "cells)", title_justify="left")


def patch_view(r: PatchResult, width: int | None = 120) -> RenderableType:
    notes = bullets(r.notes)
    return Group(header(r.model), summary(r), grid_table(r, width), notes)


def patch_figure(r: PatchResult) -> tuple[Figure, dict]:
    """The causal-tracing heatmap: layers × positions, the target's restored probability."""
    plt = pyplot()
    tokens = [t.text for t in r.tokens]
    series = {"grid": [list(row) for row in r.grid], "p_clean": r.p_clean,
              "p_corrupt": r.p_corrupt, "tokens": tokens}
    T = len(r.tokens)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * T + 2), max(4.0, 0.18 * len(r.grid) + 2)),
                           constrained_layout=True)
    im = ax.imshow(series["grid"], cmap="Purples", vmin=0, vmax=max(r.p_clean, 1e-6),
                   aspect="auto", origin="lower")
    ax.set_xticks(range(T), [visible(t) for t in tokens], rotation=45, ha="right")
    ax.set_ylabel("layer")
    what = {"resid": "residual stream", "attn": "attention output", "mlp": "MLP output"}[r.what]
    ax.set_title(f"Restoring the {what}: p({visible(r.target.text)}) "
                 f"(clean {r.p_clean:.3f}, corrupted {r.p_corrupt:.3f})")
    fig.colorbar(im, ax=ax)
    return fig, series
