"""steer in `fptrace tui`: what if the selected block's output were pushed toward the attributed
token."""

from __future__ import annotations

from typing import Any

from fptrace.cli.actions import TuiAction


def _steer(app: Any) -> None:
    """The attributed token's LM-head row, norm-matched, added at 0, 0.25, 0.5 and 1."""
    from fptrace.commands.steer.core import steer
    from fptrace.commands.steer.render import steer_view
    from fptrace.render.text import visible

    if app.trace is None:
        return
    block = max(app.layer - 1, 0)
    token = app.trace.top_k[app.target]
    app.whatif(lambda: steer(app.lm, app.traced, token=f"#{token.id}", layer=block,
                             norm_match=True, scales="0,0.25,0.5,1", new_tokens=4),
               steer_view, f"steered block {block} toward {visible(token.text)!r}")


ACTIONS = (TuiAction(40, "s", "Steer", _steer, show=False,
                     hint="s: steer its output toward the attributed token"),)
