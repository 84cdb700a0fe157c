"""Rich renderables for `fptrace attribute`."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text

from ..results import Attribution, Contribution
from .fit import Col, fit_table
from .tables import header
from .text import bar, bullets, visible

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
