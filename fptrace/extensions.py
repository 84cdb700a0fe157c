"""The extension points of a command folder, found, not listed.

A command is one folder, fptrace/commands/<name>/. Besides its cli.py (which cli/main.py finds),
the folder may hold, each optional:

    notes.py     its notes (fptrace/notes.py collects them)
    report.py    its report section and the report options it takes (`fptrace report`)
    tui.py       its TUI actions and panes (`fptrace tui`)
    examples.py  its golden views and bad-input cases (tests/golden.py, scripts/bad_inputs.py)
    result.py    its result types and check targets (`fptrace schema`)

The code that collects them asks this module for the modules of one part, never for a command
by name, so adding a command adds none of its names to a shared list. The command folders are
imported by their module path (importlib), so this leaf has no static arrow back up.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from types import ModuleType

COMMANDS = "fptrace.commands"


def command_names() -> list[str]:
    """Every command folder, by name."""
    package = importlib.import_module(COMMANDS)
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg)


def parts(part: str) -> list[tuple[str, ModuleType]]:
    """(command, module) of every commands/<command>/<part>.py that exists, by command name."""
    out = []
    for name in command_names():
        module = f"{COMMANDS}.{name}.{part}"
        if importlib.util.find_spec(module) is not None:
            out.append((name, importlib.import_module(module)))
    return out


def declared(part: str, attribute: str) -> list[tuple[str, object]]:
    """(command, value) of every commands/<command>/<part>.py that defines `attribute`."""
    return [(name, getattr(module, attribute)) for name, module in parts(part)
            if hasattr(module, attribute)]
