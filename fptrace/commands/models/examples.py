"""Examples of `fptrace models`: its golden view and its bad inputs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fptrace.examples import Bench, Render, View

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel


def _view(lm: LoadedModel, bench: Bench) -> Render:
    from fptrace.commands.models.core import list_models
    from fptrace.commands.models.render import models_table

    rows = list_models()
    return lambda w: models_table(rows, w)


VIEWS = (View("models", _view),)
