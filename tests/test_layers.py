"""The shape of the package, enforced: no import cycle, every arrow in the allowed direction, no
private name imported from another module, and the public API real.

    cli.main ──► commands/<name>/ ──► core/ · models/ · families/ · render/ ──► leaves
                      │  (and cli.io, cli.options: what every command shares)

- leaves (errors.py, atomic.py, results.py, notes.py, points.py) import only
  each other;
- render/ imports only render/ and the leaves: it never touches the engine;
- families/ imports only families/ and the leaves;
- models/ imports models/, families/ and the leaves;
- core/ imports core/, models/, families/ and the leaves: never a command, the CLI or render;
- a command imports its own folder, the engine, render/, cli.io and cli.options; only the
  composers (report, tui, schema) import other commands;
- cli.io and cli.options import no command; cli.main finds the commands by walking the package.

Imports inside functions count (they are the heavy ones); imports under `if TYPE_CHECKING:` do
not (they run only in a type checker).
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "fptrace"
LEAVES = {"fptrace.errors", "fptrace.atomic", "fptrace.results", "fptrace.notes", "fptrace.numbers",
          "fptrace.interrupt", "fptrace.jsontext", "fptrace.locks",
          "fptrace.points"}
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
    if parts[1] == "cli":
        return "cli.main" if module == "fptrace.cli.main" else "cli.toolkit"
    return parts[1]


ALLOWED = {
    "leaf": {"leaf"},
    "render": {"render", "leaf"},
    "families": {"families", "leaf"},
    "models": {"models", "families", "leaf"},
    "core": {"core", "models", "families", "leaf"},
    "cli.toolkit": {"cli.toolkit", "core", "models", "render", "leaf"},
    "cli.main": {"cli.toolkit", "leaf", "models", "commands"},  # commands: found by walking
    "package": {"leaf"},
    "__main__": {"cli.main"},
}


def _allowed(src: str, dst: str) -> bool:
    a, b = _area(src), _area(dst)
    if a.startswith("command:"):
        if b.startswith("command"):
            return a == b or a.split(":")[1] in COMPOSERS
        return b in {"core", "models", "families", "render", "leaf", "cli.toolkit"}
    return b in ALLOWED.get(a, set())


def test_no_import_cycle():
    graph = {m: {t for t, _, _ in edges if t in _graph_keys()} for m, edges in _graph().items()}
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
    assert _allowed("fptrace.commands.report.core", "fptrace.commands.attribute.core")
    assert not _allowed("fptrace.families.llama", "fptrace.models.loading")
    assert not _allowed("fptrace.commands.run.cli", "fptrace.cli.main")
    assert _area("fptrace.commands.run.cli") == "command:run"


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
