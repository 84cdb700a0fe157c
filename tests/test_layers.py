"""The shape of the package, enforced: no import cycle, every arrow in the allowed direction, no
private name imported from another module, and the public API real.

    cli.main ──► commands/<name>/ ──► core/ · models/ · families/ · render/ ──► leaves
                      │  (and cli.io, cli.options: what every command shares)

- leaves (errors.py, atomic.py, results.py, notes.py, numbers.py, points.py, addresses.py,
  extensions.py, examples.py, userfiles.py, version.py, interrupt.py, allocation.py) import only
  each other (extensions.py finds the command folders'
  parts by their module path, at run time: no static arrow);
- render/ imports only render/ and the leaves: it never touches the engine;
- families/ imports only families/ and the leaves;
- models/ imports models/, families/ and the leaves;
- core/ imports core/, models/, families/ and the leaves: never a command, the CLI or render;
- a command imports its own folder, the engine, render/ and cli/'s toolkit, never another
  command: the composers (report, tui, schema) collect what the folders offer through
  extensions.py (report.py sections, tui.py keys and panes, result.py kinds) and name none;
- cli/'s toolkit imports no command; cli.main finds the commands by walking the package;
- folder by folder, every arrow points down: leaves ◄ families ◄ models ◄ core ◄ cli toolkit ◄
  commands ◄ cli.main ◄ client (render/ sits just above the leaves); no folder imports one
  above it, but for the one command that runs command lines: `serve` calls cli.main's `answer`
  for its clients (at run time, inside a function);
- client.py, what every `fptrace` call starts with, imports the leaves and, where no server
  answers, cli.main: nothing else (it must stay light).

Imports inside functions count (they are the heavy ones); imports under `if TYPE_CHECKING:` do
not (they run only in a type checker).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "fptrace"
LEAVES = {"fptrace.errors", "fptrace.atomic", "fptrace.results", "fptrace.notes", "fptrace.numbers",
          "fptrace.points", "fptrace.addresses", "fptrace.extensions", "fptrace.examples",
          "fptrace.interrupt", "fptrace.jsontext", "fptrace.locks", "fptrace.serving",
          "fptrace.userfiles", "fptrace.version", "fptrace.allocation"}
COMPOSERS = {"report", "tui", "schema"}


def _module(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, int, list[str]]]:
    """(module imported, line, names) of every fptrace import outside TYPE_CHECKING blocks."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            skip |= {id(n) for child in node.body for n in ast.walk(child)}
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "fptrace":
            out.append((node.module, node.lineno, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno, []) for a in node.names
                    if a.name.split(".")[0] == "fptrace"]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            out.append(("." * node.level + (node.module or ""), node.lineno, []))
    return out


@functools.cache  # the package's files do not change during a run; read once
def _graph() -> dict[str, list[tuple[str, int, list[str]]]]:
    modules = {_module(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        edges = []
        for target, line, names in _imports(path):
            # `from fptrace.x import y` where y is a module counts as an import of fptrace.x.y
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            edges += [(t, line, []) for t in subs] or [(target, line, names)]
        graph[name] = edges
    return graph


def _area(module: str) -> str:
    """Which part of the package a module belongs to."""
    if module in LEAVES:
        return "leaf"
    parts = module.split(".")
    if len(parts) == 1:
        return "package"
    if parts[1] == "commands":
        return f"command:{parts[2]}" if len(parts) > 2 else "commands"
    if parts[1] == "engines":
        return f"engine:{parts[2]}" if len(parts) > 2 else "engines"
    if parts[1] == "cli":
        return "cli.main" if module == "fptrace.cli.main" else "cli.toolkit"
    return parts[1]


ALLOWED = {
    "leaf": {"leaf"},
    "render": {"render", "leaf"},
    "families": {"families", "leaf"},
    "models": {"models", "families", "leaf"},
    "core": {"core", "models", "families", "leaf"},
    "engines": {"leaf"},
    "cli.toolkit": {"cli.toolkit", "core", "models", "render", "leaf", "engines"},
    "cli.main": {"cli.toolkit", "leaf", "models", "commands"},  # commands: found by walking
    "package": {"leaf"},
    "client": {"leaf", "cli.main"},
    "__main__": {"client"},
}


def _allowed(src: str, dst: str) -> bool:
    a, b = _area(src), _area(dst)
    if a == "command:serve" and b == "cli.main":  # the server runs command lines (see above)
        return True
    if a.startswith(("command:", "engine:")):
        if b.startswith(("command", "engine:")):
            return a == b or (a.startswith("command:") and b.startswith("engine:"))
        return b in {"core", "models", "families", "render", "leaf", "cli.toolkit", "engines"}
    return b in ALLOWED.get(a, set())


def test_no_import_cycle():
    keys = _graph_keys()
    graph = {m: {t for t, _, _ in edges if t in keys} for m, edges in _graph().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def _graph_keys() -> set[str]:
    return {_module(p) for p in PKG.rglob("*.py")}


def test_every_arrow_points_the_allowed_way():
    wrong = []
    for src, edges in _graph().items():
        for dst, line, _ in edges:
            if dst.startswith("."):
                wrong.append(f"{src}:{line} uses a relative import ({dst})")
            elif dst.startswith("fptrace") and not _allowed(src, dst):
                wrong.append(f"{src}:{line} imports {dst} ({_area(src)} → {_area(dst)})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_private_name_is_imported_from_another_module():
    found = [f"{src}:{line} imports {n} from {dst}" for src, edges in _graph().items()
             for dst, line, names in edges for n in names
             if n.startswith("_") and not n.startswith("__")]
    assert not found, "\n".join(found)


def test_the_rules_catch_a_wrong_arrow():
    assert not _allowed("fptrace.render.tables", "fptrace.core.trace")
    assert not _allowed("fptrace.core.trace", "fptrace.commands.run.render")
    assert not _allowed("fptrace.commands.patch.core", "fptrace.commands.attribute.core")
    assert not _allowed("fptrace.commands.report.core", "fptrace.commands.attribute.core")
    assert not _allowed("fptrace.commands.tui.app", "fptrace.commands.steer.core")
    assert not _allowed("fptrace.families.llama", "fptrace.models.loading")
    assert not _allowed("fptrace.commands.run.cli", "fptrace.cli.main")
    assert _area("fptrace.commands.run.cli") == "command:run"


# a folder's place in the picture: an arrow may only point to a lower rank (or stay inside)
RANK = {"leaf": 0, "engines": 0.5, "render": 1, "families": 1, "models": 2, "core": 3,
        "cli.toolkit": 4, "engine folders": 4.5, "commands": 5, "cli.main": 6, "package": 1,
        "client": 7, "__main__": 8}


def _folder(module: str) -> str:
    area = _area(module)
    if area.startswith("engine:"):
        return "engine folders"
    return "commands" if area.startswith("command") else area


def test_no_folder_level_import_runs_back_up():
    """Folder by folder (every command one folder of commands/), each arrow points down the
    picture, so the folders have no cycle either (`core/ ↔ models/` was one)."""
    up = sorted({f"{_folder(src)} → {_folder(dst)} ({src}:{line} imports {dst})"
                 for src, edges in _graph().items() for dst, line, _ in edges
                 if dst.startswith("fptrace") and _folder(src) != _folder(dst)
                 and RANK[_folder(dst)] >= RANK[_folder(src)]
                 and not (_area(src) == "command:serve" and _area(dst) == "cli.main")})
    assert not up, "imports that run up the folder picture:\n" + "\n".join(up)


def test_composers_name_no_command():
    """report, tui and schema import no other command and hold no other command's name in
    their code: they iterate over what the folders offer."""
    commands = sorted(p.name for p in (PKG / "commands").iterdir() if (p / "cli.py").exists())
    wrong = []
    for composer in sorted(COMPOSERS):
        for path in sorted((PKG / "commands" / composer).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                        node.value in set(commands) - {composer}:
                    wrong.append(f"{path.relative_to(PKG)}:{node.lineno} {node.value!r}")
            for dst, line, _ in _imports(path):
                if dst.startswith("fptrace.commands.") and \
                        dst.split(".")[2] != composer:
                    wrong.append(f"{path.relative_to(PKG)}:{line} imports {dst}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.system
def test_the_public_api_has_real_signatures():
    """Every public name is the object of the module the API names (not a `**kwargs` wrapper),
    and importing fptrace imports neither torch nor any of them."""
    import importlib
    import inspect
    import subprocess
    import sys

    import fptrace

    names = fptrace.api()
    assert {"load_model", "trace", "explain", "attribute", "patch", "diff"} <= set(names)
    for name, (module, attribute) in names.items():
        obj = getattr(fptrace, name)
        assert obj is getattr(importlib.import_module(module), attribute), name
        if inspect.isfunction(obj):
            params = inspect.signature(obj).parameters.values()
            assert not any(p.kind is p.VAR_KEYWORD for p in params), name
    code = "import sys, fptrace; print('torch' in sys.modules, 'fptrace.core.trace' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["False", "False"], done.stdout + done.stderr


# the options that name a place in the model: read as text by fptrace.addresses, never by Click's
# int() (which takes '٣' for 3) nor by a parser of their own
PLACE_OPTIONS = {"--head", "--mlp", "--layer", "--positions", "--qk", "--deep-layers", "--query",
                 "--key", "--steer-layer", "--expert", "--experts", "--site", "--block"}
PLACE_PARSER = r"(parse|read|check)_(heads?|layers?|blocks?|positions?|experts?|sites?|places?|qk)"


def _options(tree: ast.AST):
    """(flag, annotation text, line) of every `Annotated[T, typer.Option("--flag", ...)]`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Annotated" \
                and isinstance(node.slice, ast.Tuple) and len(node.slice.elts) >= 2:
            call = node.slice.elts[1]
            if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "Option":
                for arg in call.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        yield arg.value, ast.unparse(node.slice.elts[0]), node.lineno


def test_only_addresses_parses_a_place():
    """One parser for a place in the model (fptrace/addresses.py): no `isdigit`-style test of
    text anywhere (`'²'.isdigit()` is True, then `int('²')` raises), no function of another
    module that parses a place, and every place option of every command typed as text and read
    through fptrace.addresses in its cli.py (or, for the report's options, its report.py)."""
    import re

    wrong = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in (
                    "isdigit", "isdecimal", "isnumeric"):
                wrong.append(f"{rel}:{node.lineno} calls .{node.func.attr}() (use "
                             "fptrace.numbers or fptrace.addresses)")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    rel != "fptrace/addresses.py" and re.fullmatch(PLACE_PARSER, node.name):
                wrong.append(f"{rel}:{node.lineno} defines {node.name}, a place parser of its "
                             "own (use fptrace.addresses)")
        if path.name in ("cli.py", "report.py") and path.parent.parent.name == "commands":
            places = [(flag, ann, line) for flag, ann, line in _options(tree)
                      if flag in PLACE_OPTIONS]
            for flag, ann, line in places:
                if ann not in ("str", "Optional[str]", "List[str]", "Optional[List[str]]",
                               "str | None", "list[str]", "list[str] | None"):
                    wrong.append(f"{rel}:{line} {flag} is typed {ann}, not text read by "
                                 "fptrace.addresses")
            if places and "fptrace.addresses" not in {t for t, _, _ in _imports(path)}:
                wrong.append(f"{rel} takes {', '.join(f for f, _, _ in places)} without "
                             "fptrace.addresses")
    assert not wrong, "\n".join(wrong)


def test_the_place_check_catches_a_parser_of_its_own(tmp_path):
    """The check above is not vacuous: it sees the options it guards, and the shapes it
    refuses are found in a module written that way."""
    import re

    seen = {flag for path in PKG.glob("commands/*/cli.py")
            for flag, _, _ in _options(ast.parse(path.read_text(encoding="utf-8")))}
    assert {"--head", "--mlp", "--layer", "--positions", "--qk", "--deep-layers", "--query",
            "--key"} <= seen
    bad = ast.parse('def parse_head(spec):\n    layer, _, head = spec.partition(".")\n'
                    '    return int(layer) if layer.isdigit() else None\n'
                    'x: Annotated[int, typer.Option("--head")] = 0\n')
    assert any(getattr(n.func, "attr", None) == "isdigit" for n in ast.walk(bad)
               if isinstance(n, ast.Call))
    assert any(re.fullmatch(PLACE_PARSER, n.name) for n in ast.walk(bad)
               if isinstance(n, ast.FunctionDef))
    assert list(_options(bad)) == [("--head", "int", 4)]
    in_report = {flag for path in PKG.glob("commands/*/report.py")
                 for flag, _, _ in _options(ast.parse(path.read_text(encoding="utf-8")))}
    assert {"--layer", "--head", "--steer-layer", "--qk"} <= in_report


def _module_map():
    import importlib.util

    spec = importlib.util.spec_from_file_location("module_map", PKG.parent / "scripts" / "module_map.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_module_map_is_generated_and_current():
    """docs/modules.md is what scripts/module_map.py writes from the docstrings now: a module
    added, moved or re-described without regenerating it fails here."""
    doc = (PKG.parent / "docs" / "modules.md").read_text(encoding="utf-8")
    stale = "docs/modules.md is stale: python scripts/module_map.py"
    assert doc == _module_map().markdown(), stale


def test_the_module_map_needs_every_module_described(tmp_path, monkeypatch):
    mm = _module_map()
    assert mm.first_sentence("Heads (Elhage et al. 2021) in block 23.4. Then more.") == \
        "Heads (Elhage et al. 2021) in block 23.4."
    (tmp_path / "fptrace").mkdir()
    (tmp_path / "fptrace" / "__init__.py").write_text('"""A package."""\n')
    (tmp_path / "fptrace" / "bare.py").write_text("x = 1\n")
    monkeypatch.setattr(mm, "ROOT", tmp_path)
    monkeypatch.setattr(mm, "PACKAGE", tmp_path / "fptrace")
    with pytest.raises(SystemExit, match=r"bare\.py has no module docstring"):
        mm.markdown()
