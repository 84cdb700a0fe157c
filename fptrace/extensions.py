"""The extension points of a command folder (and of an engine folder), found, not listed.

A command is one folder, fptrace/commands/<name>/. Besides its cli.py (which cli/main.py finds),
the folder may hold, each optional:

    notes.py     its notes (fptrace/notes.py collects them)
    report.py    its report section and the report options it takes (`fptrace report`)
    tui.py       its TUI actions and panes (`fptrace tui`)
    examples.py  its golden views and bad-input cases (tests/golden.py, scripts/bad_inputs.py)
    result.py    its result types and check targets (`fptrace schema`)

The code that collects them asks this module for the modules of one part, never for a command
by name, so adding a command adds none of its names to a shared list. An engine,
fptrace/engines/<name>/, is found the same way (its engine.py, fptrace/engines/__init__.py) and
may hold notes.py and examples.py too: a part is looked for in every folder of both. The folders
are imported by their module path (importlib), so this leaf has no static arrow back up.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from types import ModuleType

COMMANDS = "fptrace.commands"
ENGINES = "fptrace.engines"
FOLDERS = (COMMANDS, ENGINES)


def folder_names(package: str = COMMANDS) -> list[str]:
    """Every folder of `package` (the command folders by default), by name."""
    found = importlib.import_module(package)
    return sorted(m.name for m in pkgutil.iter_modules(found.__path__) if m.ispkg)


def command_names() -> list[str]:
    """Every command folder, by name."""
    return folder_names(COMMANDS)


def parts(part: str, package: str | None = None) -> list[tuple[str, ModuleType]]:
    """(folder, module) of every <folder>/<part>.py that exists: of `package`'s folders, or of
    the command folders then the engine folders; by folder name within each."""
    out = []
    for where in FOLDERS if package is None else (package,):
        for name in folder_names(where):
            module = f"{where}.{name}.{part}"
            if importlib.util.find_spec(module) is not None:
                out.append((name, importlib.import_module(module)))
    return out


def declared(part: str, attribute: str,
             package: str | None = None) -> list[tuple[str, object]]:
    """(folder, value) of every <folder>/<part>.py that defines `attribute` (see parts)."""
    return [(name, getattr(module, attribute)) for name, module in parts(part, package)
            if hasattr(module, attribute)]
