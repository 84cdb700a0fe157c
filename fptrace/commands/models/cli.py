"""`fptrace models`."""

from __future__ import annotations

from fptrace.cli.io import Group, command, emit_json, show
from fptrace.cli.options import JsonOpt, WideOpt


@command(order=110, group=Group.reference,
         examples=('fptrace models',))
def models(as_json: JsonOpt = False, wide: WideOpt = False) -> None:
    """The built-in models, and whether their weights are here.

    List the built-in models and whether their weights are available here."""
    from fptrace.commands.models.core import list_models

    rows = list_models()
    if as_json:
        from fptrace.commands.models.result import ModelList

        emit_json(ModelList(models=tuple(rows)))
        return
    from fptrace.commands.models.render import models_table

    show(lambda width: models_table(rows, width), wide)
