"""A command is one folder, and the shared code only collects what the folders offer
(fptrace/extensions.py): no package file outside a command's folder names it, every module of
core/ serves two commands or more, and a new command folder, written in a copy of the package, is
found by the CLI, the notes registry, the report, the TUI, the golden views, the bad-input cases
and the schema without another file being edited."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "fptrace"
COMMANDS = sorted(p.name for p in (PKG / "commands").iterdir() if (p / "cli.py").exists())

# Where a command's name may appear outside its folder, and why. Prose is not checked
# (docstrings, comments, and the messages that send a user to `fptrace <name>`): it points the
# reader at another command, as documentation does, and no feature has to edit it.
ALLOWED = {
    # the extension parts are named after the composers that collect them (report.py, tui.py)
    ("fptrace/cli/sections.py", "report"): "the part a folder offers: report.py",
    ("fptrace/cli/actions.py", "tui"): "the part a folder offers: tui.py",
    # docs/notes.md's "printed by" column: a note names the commands that show it
    ("fptrace/notes.py", "*"): "the shared notes' printed-by column",
    ("fptrace/commands/*/notes.py", "report"): "a note's printed-by column names the composer",
    ("fptrace/commands/*/notes.py", "tui"): "a note's printed-by column names the composer",
    # the statistics file format is shared by the command that writes it and diff --stats,
    # which reads it: its reader checks the file's kind, which is that command's name
    ("fptrace/core/activation_stats.py", "stats"): "a statistics file's kind",
}


def _allowed(rel: str, name: str) -> bool:
    return any(Path(rel).match(f) and n in ("*", name) for f, n in ALLOWED)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    # the string under a dataclass field (its description in the schema) is prose too
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for a, b in zip(body, body[1:]):
                if isinstance(a, (ast.AnnAssign, ast.Assign)) and isinstance(b, ast.Expr) and \
                        isinstance(b.value, ast.Constant):
                    out.add(id(b.value))
    return out


def mentions(path: Path, names: list[str]) -> list[tuple[int, str, str]]:
    """(line, command, what) of every place a file's code names a command: an import of its
    folder, a string that holds its module path, or a string that is its name (data: a list of
    commands, a key, a kind)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        modules = []
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        for name in names:
            if any(re.match(rf"fptrace\.commands\.{name}(\.|$)", m) for m in modules):
                found.append((node.lineno, name, "import"))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in prose:
            for name in names:
                if node.value == name or re.search(rf"commands[./]{name}\b", node.value):
                    found.append((node.lineno, name, repr(node.value[:60])))
    return sorted(found)


def test_a_command_is_named_only_in_its_folder():
    wrong = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for line, name, what in mentions(path, COMMANDS):
            if rel.startswith(f"fptrace/commands/{name}/") or _allowed(rel, name):
                continue
            if rel == "fptrace/__init__.py" and what == "import":
                continue  # the public API: one import line a name
            wrong.append(f"{rel}:{line} names {name}: {what}")
    assert not wrong, ("a command named outside its folder (collect through "
                       "fptrace/extensions.py instead):\n" + "\n".join(wrong))


def test_the_name_check_catches_a_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""Prose may say `fptrace steer`."""\n'
                   "from fptrace.commands.steer.core import steer\n"
                   'WHO = ("steer",)\n'
                   'WHERE = "fptrace/commands/steer/core.py"\n'
                   'HINT = "try `fptrace steer`"\n')
    assert [(n, w) for _, n, w in mentions(bad, COMMANDS)] == [
        ("steer", "import"), ("steer", "'steer'"), ("steer", "'fptrace/commands/steer/core.py'")]


def test_the_allow_list_is_used():
    """Every entry still excuses something (a stale entry would hide a new mention)."""
    used = set()
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for _, name, _ in mentions(path, COMMANDS):
            used |= {(f, n) for f, n in ALLOWED if Path(rel).match(f) and n in ("*", name)
                     and not rel.startswith(f"fptrace/commands/{name}/")}
    assert used == set(ALLOWED), set(ALLOWED) - used


def _imported_by() -> dict[str, set[str]]:
    """module -> the modules of the package that import it (inside functions too)."""
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
               for p in PKG.rglob("*.py")}
    out: dict[str, set[str]] = {m: set() for m in modules}
    for path in PKG.rglob("*.py"):
        src = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t in out:
                    out[t].add(src)
    return out


def commands_using(module: str, imported_by: dict[str, set[str]], seen: set[str] | None = None
                   ) -> set[str]:
    """The command folders that import a module, directly or through other core/ modules."""
    seen = set() if seen is None else seen
    found = set()
    for src in imported_by[module] - seen:
        seen.add(src)
        parts = src.split(".") + ["", ""]
        if parts[1] == "commands" and parts[2]:
            found.add(parts[2])
        elif parts[1] == "core":
            found |= commands_using(src, imported_by, seen)
    return found


def test_every_core_module_serves_two_commands():
    """core/ holds the engines two commands or more share (the composers, which only collect,
    do not count); one command's helper belongs in its folder."""
    imported_by = _imported_by()
    composers = {"report", "tui", "schema"}
    lonely = {m: sorted(commands_using(m, imported_by) - composers) for m in imported_by
              if m.startswith("fptrace.core.")}
    lonely = {m: users for m, users in lonely.items() if len(users) < 2}
    assert not lonely, f"core/ modules that fewer than two commands use (move them): {lonely}"
