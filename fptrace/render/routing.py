"""The routing of a mixture-of-experts trace as a table: per MoE block, the experts the router
chose at the last position, their weights, the router's mass on them and its entropy."""

from __future__ import annotations

import math

from rich.console import RenderableType

from fptrace.render.fit import Col, fit_table
from fptrace.results import Routing

ROUTING_COLS = (Col("block", 0, "right"), Col("experts (weight)", 0, wrap=True),
                Col("router mass\non them", 1, "right"), Col("router\nentropy", 1, "right"),
                Col("entropy\n/ ln E", 2, "right"))


def routing_table(routing: Routing, width: int | None = 120) -> RenderableType:
    """One row per MoE block at the last position; the caption says whether the family's rule,
    recomputed from the router's logits, gave the same choices at every block and position."""
    ln_e = math.log(routing.n_experts)
    rows = []
    for b in routing.blocks:
        rows.append([str(b.layer),
                     "  ".join(f"{e} ({w:.3f})" for e, w in zip(b.experts[-1], b.weights[-1])),
                     f"{b.mass[-1]:.3f}", f"{b.entropy[-1]:.3f}", f"{b.entropy[-1] / ln_e:.2f}"])
    last = len(routing.blocks[0].mass) - 1 if routing.blocks else 0
    shared = f", + {routing.n_shared} shared expert(s) every position" if routing.n_shared else ""
    if routing.checked:
        check = (f"checked: the {routing.scoring} rule recomputed from the router's logits chose "
                 f"the same experts with the same weights (within {routing.max_weight_error:.1e})"
                 " at every block and position")
    else:
        check = (f"NOT checked: the {routing.scoring} rule recomputed from the router's logits "
                 f"differs at {routing.mismatched} block-positions (weights up to "
                 f"{routing.max_weight_error:.2e} apart); the experts and weights shown are the "
                 "router's own, its mass and entropy follow the rule")
    return fit_table(ROUTING_COLS, rows, width,
                     title=f"Routing at the last position ({last}): the {routing.top_k} of "
                     f"{routing.n_experts} experts each block chose{shared}",
                     title_justify="left", caption="weight: what the expert's output is "
                     "multiplied by; mass: the router's probability on the chosen experts; "
                     f"entropy in nats (ln E = {ln_e:.2f}: uniform). {check}. --json has every "
                     "position.", caption_justify="left")


def top1_grid(routing: Routing, tokens: tuple, width: int | None = 120) -> RenderableType:
    """`--all-positions`: a blocks × positions grid of the expert each block weighted most at
    each position (the last positions that fit the width when the prompt is long)."""
    from rich.table import Table
    from rich.text import Text

    from fptrace.render.text import visible

    n = len(routing.blocks[0].experts) if routing.blocks else 0
    cell = max(4, len(str(routing.n_experts - 1)) + 2)
    fit = n if width is None else max(1, min(n, (width - 10) // cell))
    shown = range(n - fit, n)
    which = f"all {n}" if fit == n else f"the last {fit} of {n}"
    table = Table(title=f"Top-1 expert per block and position ({which} positions)",
                  title_justify="left", box=None, padding=(0, 1))
    table.add_column("block", justify="right", no_wrap=True)
    for p in shown:
        text = visible(tokens[p].text) if p < len(tokens) else str(p)
        table.add_column(Text(f"{p}\n{text[:cell - 1]}"), justify="right", no_wrap=True)
    for b in routing.blocks:
        table.add_row(str(b.layer), *(str(b.experts[p][0]) for p in shown))
    return table
