"""Rich renderables for `fptrace attribute`."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from fptrace.commands.attribute.result import Attribution, Contribution
from fptrace.render.figures import pyplot
from fptrace.render.fit import Col, fit_table
from fptrace.render.tables import header
from fptrace.render.text import bar, bullets, visible

NAMES = {"embed": "embedding", "attn_head": "attention head", "attn_bias": "attention W_O bias",
         "attn": "attention (not split)", "mlp": "MLP", "final_norm_bias": "final norm bias",
         "lm_head_bias": "LM head bias"}


def _what(a: Attribution) -> str:
    t = f"{visible(a.target.text)!s} (id {a.target.id})"
    if a.versus is None:
        return f"the logit of {t}"
    return f"the logit difference {t} − {visible(a.versus.text)} (id {a.versus.id})"


def summary(a: Attribution) -> Text:
    t = a.target
    text = Text(f"Attributing {_what(a)} at the last position; {visible(t.text)} has p = "
                f"{t.prob:.4f}, rank {t.rank}", style="bold")
    if a.versus is not None:
        text.append(f"; {visible(a.versus.text)} has p = {a.versus.prob:.4f}, rank "
                    f"{a.versus.rank}")
    text.append("\n")
    text.append(f"sum of the parts {a.total:.4f}   model logit {a.model_logit:.4f}   "
                f"difference {a.difference:+.2e}   ({a.tolerance})")
    if a.capped_logit is not None:
        text.append(f"\nafter the final softcap the model's logit is {a.capped_logit:.4f}")
    return text


TOP_COLS = (Col("#", 0, "right"), Col("part", 0), Col("layer", 0, "right"),
            Col("head", 0, "right"), Col("logits", 0, "right"), Col("", 2),
            Col("share", 1, "right"))


def _row(k: int, c: Contribution, top: float) -> list:
    return [str(k), NAMES.get(c.component, c.component),
            "" if c.layer is None else str(c.layer), "" if c.head is None else str(c.head),
            f"{c.value:+.3f}", Text(bar(abs(c.value), top, 10),
                                    style="green" if c.value >= 0 else "red"),
            f"{c.share:+.1%}"]


def top_table(a: Attribution, width: int | None) -> RenderableType:
    top = max((abs(c.value) for c in a.top), default=0.0)
    rows = [_row(k + 1, c, top) for k, c in enumerate(a.top)]
    return fit_table(TOP_COLS, rows, width, title=f"The {len(a.top)} largest contributions "
                     "(share: of Σ|parts|; green pushes the target up, red down)",
                     title_justify="left")


LAYER_COLS = (Col("layer", 0, "right"), Col("attention", 0, "right"), Col("", 3),
              Col("MLP", 0, "right"), Col(" ", 3), Col("block", 1, "right"))


def layers_table(a: Attribution, width: int | None) -> RenderableType:
    top = max((max(abs(l.attn), abs(l.mlp)) for l in a.layers), default=0.0)
    rows = [["embed", f"{a.contributions[0].value:+.3f}", "", "", "", ""]]
    for l in a.layers:
        rows.append([str(l.layer), f"{l.attn:+.3f}",
                     Text(bar(abs(l.attn), top, 8), style="green" if l.attn >= 0 else "red"),
                     f"{l.mlp:+.3f}",
                     Text(bar(abs(l.mlp), top, 8), style="green" if l.mlp >= 0 else "red"),
                     f"{l.attn + l.mlp:+.3f}"])
    return fit_table(LAYER_COLS, rows, width, title="Per block (logits)", title_justify="left")


def verdict(a: Attribution) -> Text:
    if a.ok:
        return Text(f"✓ the parts sum to the model's logit: difference {a.difference:+.2e}",
                    style="bold green")
    return Text(f"✗ THE PARTS DO NOT SUM TO THE MODEL'S LOGIT: difference {a.difference:+.2e} "
                f"({a.tolerance}). Do not trust the numbers above.", style="bold white on red")


def attribution_view(a: Attribution, width: int | None = 120) -> RenderableType:
    notes = bullets(a.notes)
    return Group(header(a.model), summary(a), top_table(a, width), layers_table(a, width),
                 notes, verdict(a))


def attribution_figure(a: Any) -> tuple[Any, dict]:
    """Per-block bars (attention and MLP, in logits) and the layer × head heatmap."""
    plt = pyplot()
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
