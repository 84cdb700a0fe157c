"""Examples of `fptrace models`: its golden view and its bad inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fptrace.examples import Bench, View


def _view(lm: Any, bench: Bench) -> Callable[[Any], Any]:
    from fptrace.commands.models.core import list_models
    from fptrace.commands.models.render import models_table

    rows = list_models()
    return lambda w: models_table(rows, w)


VIEWS = (View("models", _view),)
