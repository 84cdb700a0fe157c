"""ablate in `fptrace tui`: what if the selected block's head and MLP were gone."""

from __future__ import annotations

from typing import Any

from fptrace.cli.actions import TuiAction


def _ablate(app: Any) -> None:
    """Zero ablation of the selected block's current head and of its MLP."""
    from fptrace.addresses import Head
    from fptrace.commands.ablate.core import ablate
    from fptrace.commands.ablate.render import ablate_view

    if app.trace is None:
        return
    block = max(app.layer - 1, 0)
    head = Head(block, app.head)
    app.whatif(lambda: ablate(app.lm, app.traced, heads=[head], mlps=[block],
                              target=f"#{app.trace.top_k[app.target].id}"),
               ablate_view, f"removed head {head} and the MLP of block {block}")


ACTIONS = (TuiAction(30, "a", "Ablate", _ablate, show=False,
                     hint="a: remove this block's head and MLP"),)
