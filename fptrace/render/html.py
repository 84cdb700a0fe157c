"""Pieces of an HTML page: a rich renderable as the terminal shows it, a matplotlib figure as
inline PNG data, and a section of both under its heading (the report and its sections)."""

from __future__ import annotations

import base64
import io
from typing import Any


def terminal(renderable: Any, width: int = 130) -> str:
    """A rich renderable as an HTML <pre> with inline styles (what the terminal shows)."""
    from rich.console import Console

    console = Console(record=True, file=io.StringIO(), width=width, color_system="truecolor",
                      force_terminal=True)
    console.print(renderable)
    return console.export_html(inline_styles=True, code_format=(
        '<pre class="term" style="color:{foreground};background:{background}">{code}</pre>'))


def png(fig: Any) -> str:
    """A matplotlib figure as a data: URL (the figure is closed)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def section(title: str, alt: str, fig: Any, view: Any) -> list[str]:
    """One section of a page: its heading, its figure (none: no image) and its terminal view."""
    return [f"<h2>{title}</h2>",
            *([f'<img alt="{alt}" src="{png(fig)}">'] if fig is not None else []),
            terminal(view)]
