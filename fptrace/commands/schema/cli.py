"""`fptrace schema`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from fptrace.cli.io import Group, command
from fptrace.cli.options import OUTPUT


@command(order=120, group=Group.reference, docs="schema",
         examples=('fptrace schema',))
def schema(
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the field-by-field "
                                           "documentation (docs/schema.md) instead.",
                                           rich_help_panel=OUTPUT)] = False,
) -> None:
    """The JSON Schema of every JSON output.

    Print the JSON Schema of every JSON output (every command's --json, batch lines)."""
    from fptrace.commands.schema.core import schema_text

    sys.stdout.write(schema_text(markdown))
