"""Rich renderables for `fptrace attribute`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.text import Text

from fptrace.addresses import Head
from fptrace.commands.attribute.result import (
    Attribution,
    Contribution,
    QKAttribution,
    QKPart,
    QKPartSum,
)
from fptrace.render.figures import pyplot
from fptrace.render.fit import Col, fit_table
from fptrace.render.tables import header
from fptrace.render.text import bar, bullets, visible

if TYPE_CHECKING:
    from matplotlib.figure import Figure

NAMES = {"embed": "embedding", "attn_head": "attention head", "attn_bias": "attention W_O bias",
         "attn": "attention (not split)", "mlp": "MLP", "final_norm_bias": "final norm bias",
         "lm_head_bias": "LM head bias", "shared_experts": "shared experts"}


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
    part = f"expert {c.expert}" if c.expert is not None else NAMES.get(c.component, c.component)
    return [str(k), part,
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


def attribution_figure(a: Attribution) -> tuple[Figure, dict]:
    """Per-block bars (attention and MLP, in logits) and the layer × head heatmap."""
    plt = pyplot()
    series: dict[str, list] = {"layers": [l.layer for l in a.layers],
                               "attn": [l.attn for l in a.layers],
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


# ---------------------------------------------------------------- attribute --qk

def part_name(p: QKPart, side: str = "") -> str:
    """`MLP 20`, `head 11.2`, `embedding`, `Q bias`: a part of the stream at one position (the
    table's header says which)."""
    if p.component == "attn_head":
        return f"head {Head(p.layer, p.head)}"
    if p.component == "bias":
        return f"{side} bias".strip()
    named = {"embed": "embedding", "pos_embed": "position embedding",
             "rest": "the other parts"}
    if p.component in named:
        return named[p.component]
    kinds = {"attn_bias": "W_O bias", "attn": "attention (not split)", "mlp": "MLP"}
    return f"{kinds.get(p.component, p.component)} {p.layer}"


def _tok(a: QKAttribution, pos: int) -> str:
    return visible(a.tokens[pos].text)


def qk_summary(a: QKAttribution) -> Text:
    shared = "" if a.model.n_kv_heads == a.model.n_heads else \
        f" (its keys come from K/V head {a.kv_head})"
    text = Text(f"Head {Head(a.layer, a.head)}{shared}: query {a.query} {_tok(a, a.query)!r} → key "
                f"{a.key} {_tok(a, a.key)!r}", style="bold")
    text.append(f"\nscore {a.score:+.4f} = the sum of {a.n_terms:,} terms (query parts × key "
                f"parts, each scale·q·k with scale {a.scale:.4g}); from the whole streams "
                f"{a.stream_score:+.4f} (difference {a.difference:+.2e})")
    if a.capped_score is not None:
        text.append(f"\nattention softcap {a.softcap:g}: before the cap {a.score:+.4f}, after "
                    f"it {a.capped_score:+.4f} (what the softmax reads)")
    text.append(f"\nweight {a.weight:.4f} (the model's own; recomputed {a.recomputed_weight:.4f})"
                f"; the most attended key is {a.most_attended} {_tok(a, a.most_attended)!r}")
    if a.window:
        text.append(f"; sliding window of {a.window}")
    return text


def qk_terms_table(a: QKAttribution, width: int | None) -> RenderableType:
    top = max((abs(t.value) for t in a.top), default=0.0)
    cols = (Col("#", 0, "right"), Col(f"query part at {_tok(a, a.query)!r}", 0),
            Col(f"× key part at {_tok(a, a.key)!r}", 0), Col("term", 0, "right"), Col("", 1),
            Col("share", 1, "right"))
    rows = [[str(n + 1), part_name(t.query, "Q"), part_name(t.key, "K"), f"{t.value:+.4f}",
             Text(bar(abs(t.value), top, 10), style="green" if t.value >= 0 else "red"),
             f"{t.share:+.1%}"] for n, t in enumerate(a.top)]
    others = a.n_terms - len(a.top)
    if others:
        rows.append(["", f"the other {others:,} terms", "", f"{a.rest:+.4f}", "", ""])
    return fit_table(cols, rows, width, sections=(len(a.top),) if others else (),
                     title=f"The {len(a.top)} largest terms of the score (share: of Σ|terms|; "
                     "green raises the score, red lowers it)", title_justify="left")


SIDE_COLS = (Col("#", 0, "right"), Col("part", 0), Col("score", 0, "right"), Col("", 1),
             Col("‖part‖", 1, "right"))


def _side_table(parts: tuple[QKPartSum, ...], n: int, side: str, title: str,
                width: int | None) -> RenderableType:
    shown = sorted(parts, key=lambda p: -abs(p.value))[:n]
    top = max((abs(p.value) for p in shown), default=0.0)
    rows = [[str(k + 1), part_name(p.part, side), f"{p.value:+.4f}",
             Text(bar(abs(p.value), top, 10), style="green" if p.value >= 0 else "red"),
             f"{p.norm:.3f}"] for k, p in enumerate(shown)]
    if len(parts) > n:
        rest = sum(p.value for p in parts) - sum(p.value for p in shown)
        rows.append(["", f"the other {len(parts) - n} parts", f"{rest:+.4f}", "", ""])
    return fit_table(SIDE_COLS, rows, width, sections=(n,) if len(parts) > n else (),
                     title=title, title_justify="left")


def qk_sources(a: QKAttribution, width: int | None) -> RenderableType:
    q, k = _tok(a, a.query), _tok(a, a.key)
    n = len(a.top)
    return Group(
        _side_table(a.query_parts, n, "Q", f"Query side (position {a.query} {q!r}): each "
                    "part's terms summed over the key's parts; ‖part‖: its size in q", width),
        _side_table(a.key_parts, n, "K", f"Key side (position {a.key} {k!r}): each part's "
                    "terms summed over the query's parts; ‖part‖: its size in k", width))


def qk_verdict(a: QKAttribution) -> Text:
    text = Text()
    for c in a.checks:
        mark = "✓" if c.ok else "✗"
        text.append(f"{mark} {c.name}: {c.value:.2e} ({c.tolerance})\n",
                    style="green" if c.ok else "bold white on red")
    if not a.ok:
        text.append("THE SPLIT DOES NOT MATCH THE MODEL: do not trust the numbers above.",
                    style="bold white on red")
    return text


def qk_pane(a: QKAttribution, width: int | None = 80) -> RenderableType:
    """The split without the model's header and notes (the TUI's head pane)."""
    return Group(qk_summary(a), qk_terms_table(a, width), qk_verdict(a))


def qk_view(a: QKAttribution, width: int | None = 120) -> RenderableType:
    body = qk_sources(a, width) if a.group == "source" else qk_terms_table(a, width)
    return Group(header(a.model), qk_summary(a), body, bullets(a.notes), qk_verdict(a))


def qk_figure(a: QKAttribution) -> tuple[Figure, dict]:
    """The grid of terms as a heatmap: query parts (rows) × key parts (columns)."""
    plt = pyplot()
    q, k = _tok(a, a.query), _tok(a, a.key)
    rows = [part_name(p, "Q") for p in a.grid_rows]
    cols = [part_name(p, "K") for p in a.grid_columns]
    series = {"rows": rows, "columns": cols, "grid": [list(r) for r in a.grid]}
    fig, ax = plt.subplots(figsize=(3 + 1.1 * len(cols), 2 + 0.55 * len(rows)),
                           constrained_layout=True)
    lim = max((abs(v) for r in a.grid for v in r), default=0.0) or 1.0
    im = ax.imshow(series["grid"], cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    for r, line in enumerate(a.grid):
        for c, v in enumerate(line):
            ax.text(c, r, f"{v:+.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(cols)), cols, rotation=40, ha="right")
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel(f"parts of the key's stream (position {a.key} {k!r})")
    ax.set_ylabel(f"parts of the query's stream (position {a.query} {q!r})")
    fig.colorbar(im, ax=ax, label="score (blue raises it)")
    ax.set_title(f"{a.model.name}: head {Head(a.layer, a.head)}, score {a.score:+.3f} = Σ cells, "
                 f"weight {a.weight:.3f}" + ("  (RANDOM WEIGHTS)" if a.model.random_weights
                                             else ""))
    return fig, series
