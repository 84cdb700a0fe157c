"""`fptrace tui`."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from fptrace.cli.io import command, quiet_libraries
from fptrace.cli.options import LoadOptions, model_options


@command(order=100)
@model_options(placement=False)
def tui(
    prompt: Annotated[Optional[str], typer.Argument(help="A first prompt to trace.")] = None,
    opts: LoadOptions = LoadOptions(),
) -> None:
    """Explore forward passes interactively in the terminal, with the model loaded once:
    edit the prompt, move through the layers, switch heads, attribute, export."""
    quiet_libraries()
    from fptrace.commands.tui.app import FptraceApp

    FptraceApp(prompt=prompt, load=opts).run()
