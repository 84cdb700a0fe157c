"""heads in `fptrace tui`: the selected head's role under the heads tab (as `fptrace heads` on
the traced prompt with 2 induction sequences of up to 16 tokens, its checks run), computed once
per prompt."""

from __future__ import annotations

from typing import Any

from fptrace.cli.actions import TuiPane

TUI_INDUCTION = (2, 16)  # sequences, most tokens each (the context's half at most)


def roles_of(app: Any) -> Any:
    """`fptrace heads` over the app's traced prompt, kept on the app for that prompt."""
    from fptrace.commands.heads.core import heads
    from fptrace.core.trace import model_info

    kept = getattr(app, "head_roles", None)
    if kept is not None and kept[0] is app.traced:
        return kept[1]
    n, most = TUI_INDUCTION
    ctx = model_info(app.lm).context_length or 2 * most
    result = heads(app.lm, [app.traced], induction=n, induction_length=min(most, ctx // 2),
                   weights=False)
    app.head_roles = (app.traced, result)
    return result


def _role(app: Any) -> Any:
    from rich.text import Text

    from fptrace.commands.heads.render import head_pane
    from fptrace.errors import FptraceError

    if app.trace is None:
        return Text("")
    try:
        result = roles_of(app)
    except FptraceError as err:
        return Text(f"\nHead roles: {err}", style="yellow")
    block = max(app.layer - 1, 0)
    h = next(h for h in result.heads if (h.layer, h.head) == (block, app.head))
    return head_pane(h)


PANES = (TuiPane(22, "heads", _role),)
