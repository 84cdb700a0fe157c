"""heads in `fptrace tui`: the selected head's role under the heads tab (as `fptrace heads` on
the traced prompt with 2 induction sequences of up to 16 tokens, its checks run), measured once
per prompt on a worker thread, the interface answering meanwhile."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fptrace.cli.actions import TuiPane

if TYPE_CHECKING:
    from fptrace.commands.heads.result import Heads
    from fptrace.models.loading import LoadedModel

TUI_INDUCTION = (2, 16)  # sequences, most tokens each (the context's half at most)


def measure(lm: LoadedModel, traced: Any) -> Heads:
    """`fptrace heads` over one traced prompt, as the tab shows it."""
    from fptrace.commands.heads.core import heads
    from fptrace.core.trace import model_info

    n, most = TUI_INDUCTION
    ctx = model_info(lm).context_length or 2 * most
    return heads(lm, [traced], induction=n, induction_length=min(most, ctx // 2), weights=False)


def _role(app: Any) -> Any:
    from rich.text import Text

    from fptrace.commands.heads.render import head_pane
    from fptrace.errors import FptraceError

    if app.trace is None:
        return Text("")
    kept = getattr(app, "head_roles", None)
    if kept is None or kept[0] is not app.traced:
        traced, lm = app.traced, app.lm

        def keep(result: Any) -> None:
            app.head_roles = (traced, result)

        app.in_background("measuring the heads' roles on this prompt",
                          lambda: measure(lm, traced), keep)
        return Text("\nHead roles: being measured on this prompt (`fptrace heads`, its checks "
                    "run); the tab fills when they are", style="dim")
    if isinstance(kept[1], FptraceError):
        return Text(f"\nHead roles: {kept[1]}", style="yellow")
    block = max(app.layer - 1, 0)
    h = next(h for h in kept[1].heads if (h.layer, h.head) == (block, app.head))
    return head_pane(h)


PANES = (TuiPane(22, "heads", _role),)
