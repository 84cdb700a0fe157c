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

import pytest

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
    ("fptrace/engines/*/notes.py", "*"): "an engine note's printed-by column: the commands "
    "that take --engine",
    ("fptrace/engines/*/examples.py", "*"): "an engine's bad inputs: command lines of the "
    "commands that take --engine",
    # the statistics file format is shared by the command that writes it and diff --stats,
    # which reads it: its reader checks the file's kind, which is that command's name
    ("fptrace/core/activation_stats.py", "stats"): "a statistics file's kind",
    # --keep-warm: the client starts the server as `python -m fptrace serve` (it cannot import
    # the command: it must stay light)
    ("fptrace/client.py", "serve"): "the command line that starts a server",
}
# Command names that are also ordinary words of the code and the data: a string that is only the
# word is not a mention (an import of the folder or a string holding its module path still is).
WORDS = {
    "heads": "a model's attention heads: keyword arguments, JSON keys, labels",
    "tokens": "the key of every token list (Trace.tokens, a statistics file's counts)",
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
    # a parameter's name marked for an error's message (errors.param: `batch`, shapes'
    # --batch) names an option, not a command
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "param" and node.args:
            out.add(id(node.args[0]))
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
                word = node.value == name and name not in WORDS
                if word or re.search(rf"commands[./]{name}\b", node.value):
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


# A small real command, written the way docs/development.md's "Add a command" walks through it:
# `fptrace letters WORD` counts a word's letters. Every file of its folder, and nothing else.
LETTERS = {
    "__init__.py": '"""Count the letters of a word (the walkthrough of docs/development.md)."""\n',
    "result.py": '''
        """The result of `fptrace letters`."""

        from __future__ import annotations

        from fptrace.results import SCHEMA_VERSION, result

        SCHEMA_SINCE = "1.13"  # the version this kind arrives in
        CHECK_TARGETS = "`letters_sum` (letters)"


        @result
        class Letters:
            """A word and its letters."""

            word: str
            """The word."""
            n: int
            """How many letters it has."""
            notes: tuple[str, ...]
            """Sentences about the count."""
            kind: str = "letters"
            schema_version: str = SCHEMA_VERSION
        ''',
    "notes.py": '''
        """The notes of `fptrace letters`."""

        from __future__ import annotations

        from fptrace.notes import note

        LONG = note("letters_long", ("letters",), "the word has more than 10 letters",
                    "a long word: {n} letters")
        ''',
    "core.py": '''
        """Pure: a word in, its letters out."""

        from __future__ import annotations

        from fptrace.commands.letters.notes import LONG
        from fptrace.commands.letters.result import Letters
        from fptrace.errors import BadInput


        def letters(word: str) -> Letters:
            if not word.strip():
                raise BadInput("the word is empty: give one")
            n = sum(ch.isalpha() for ch in word)
            return Letters(word, n, (LONG(n=n),) if n > 10 else ())
        ''',
    "render.py": '''
        """The view of `fptrace letters`."""

        from __future__ import annotations

        from typing import Any


        def letters_view(r: Any, width: int | None = None) -> str:
            return f"{r.word}: {r.n} letters" + "".join(f"\\n{n}" for n in r.notes)
        ''',
    "cli.py": '''
        """`fptrace letters`."""

        from __future__ import annotations

        from typing import Annotated

        import typer

        from fptrace.cli.io import Group, command, show


        @command(order=95, group=Group.reference)
        def letters(word: Annotated[str, typer.Argument(help="A word.")]) -> None:
            """Count the letters of a word."""
            from fptrace.commands.letters.core import letters as count
            from fptrace.commands.letters.render import letters_view

            result = count(word)
            show(lambda width: letters_view(result, width))
        ''',
    "report.py": '''
        """The report's letters section (--letters WORD)."""

        from __future__ import annotations

        from typing import Annotated, Any, Optional

        import typer

        from fptrace.cli.sections import Page, ReportSection


        def _compute(page: Page, values: dict[str, Any]) -> Any:
            from fptrace.commands.letters.core import letters

            return None if values["letters"] is None else letters(values["letters"])


        SECTION = ReportSection(
            order=80, compute=_compute,
            body=lambda r: [f"<h2>Letters</h2><p>{r.word}: {r.n}</p>"],
            options=(("letters", Annotated[Optional[str], typer.Option(
                "--letters", help="Also count this word's letters.")], None),))
        ''',
    "tui.py": '''
        """letters in `fptrace tui`: a key and a tab."""

        from __future__ import annotations

        from fptrace.cli.actions import TuiAction, TuiPane

        ACTIONS = (TuiAction(45, "L", "Letters", lambda app: app.show_tab("letters")),)
        PANES = (TuiPane(50, "letters", lambda app: f"{len(app.trace.prompt)} characters"),)
        ''',
    "examples.py": '''
        """Examples of `fptrace letters`: its golden view, its bad inputs, its note's case."""

        from __future__ import annotations

        from typing import Any

        from fptrace.examples import Bench, Case, NoteCase, Setup, View


        def _view(lm: Any, bench: Bench) -> Any:
            from fptrace.commands.letters.core import letters
            from fptrace.commands.letters.render import letters_view

            r = letters("tracer")
            return lambda width: letters_view(r, width)


        def bad_inputs(at: Setup) -> tuple[Case, ...]:
            return (Case(1, "letters: an empty word", ("letters", " ")),)


        def _long(bench: Bench) -> tuple[Any, Any]:
            from fptrace.commands.letters.core import letters

            return letters("short").notes, letters("extraordinarily").notes


        VIEWS = (View("letters", _view),)
        NOTE_CASES = (NoteCase("letters_long", _long),)
        ''',
}

# run in the copy: every collector of the package, the tests and the scripts, asked what it finds
PROBE = '''
import importlib.util, json, sys
import fptrace  # the copy (PYTHONPATH), before anything puts the checkout on sys.path
from typer.testing import CliRunner
from fptrace.cli.main import app

root = sys.argv[1]
out = {}
runner = CliRunner()
r = runner.invoke(app, ["letters", "tracer"])
out["cli"] = [r.exit_code, r.stdout.strip()]
r = runner.invoke(app, ["letters", " "])
out["bad"] = [r.exit_code, r.stderr.strip()]
out["help"] = "letters" in runner.invoke(app, ["--help"]).stdout
out["report_help"] = "--letters" in runner.invoke(app, ["report", "--help"]).stdout

from fptrace.notes import NOTES, markdown
out["notes"] = ["letters_long" in NOTES, "`letters_long`" in markdown()]

from fptrace.cli.sections import collect as sections
out["sections"] = [name for name, _ in sections()]

from fptrace.commands.tui.app import ACTIONS, TABS, FptraceApp
out["tui"] = [[a.key for a in ACTIONS], list(TABS), [b.key for b in FptraceApp.BINDINGS]]

sys.path.insert(0, root + "/tests")
import golden
out["golden"] = [golden.render(golden.collect()["letters"](None, None), 80)]

spec = importlib.util.spec_from_file_location("bad_inputs", root + "/scripts/bad_inputs.py")
bad = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bad)
from fptrace.examples import Setup
out["cases"] = [[where, c.row, c.what, list(c.argv)]
                for where, found in bad.collected(Setup("/t", "/m")) for c in found
                if where == "commands/letters/"]

from fptrace.extensions import declared
cases = {c.key: c for _, cs in declared("examples", "NOTE_CASES") for c in cs}
absent, present = cases["letters_long"].run(None)
out["note_case"] = [NOTES["letters_long"].matches(s) for s in (*absent, *present)]

doc = json.loads(runner.invoke(app, ["schema"]).stdout)
out["schema"] = [doc["$id"], "Letters" in doc["$defs"],
                 "`letters_sum` (letters)" in
                 doc["$defs"]["Check"]["properties"]["target"]["description"]]
out["where"] = fptrace.__file__
print(json.dumps(out))
'''


def package_with(tmp_path: Path, folder: str, files: dict[str, str]) -> Path:
    """A copy of the package in tmp_path with one folder added (its files' texts dedented)."""
    copy = tmp_path / "fptrace"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / folder).mkdir()
    for name, text in files.items():
        (copy / folder / name).write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return copy


@pytest.mark.system
def test_a_new_command_folder_is_found_everywhere(tmp_path):
    """docs/development.md's walkthrough, done in a copy of the package: the folder
    commands/letters/ and nothing else, and every collector finds what it offers."""
    copy = package_with(tmp_path, "commands/letters", LETTERS)

    def files(top: Path) -> dict[str, bytes]:
        return {p.relative_to(top).as_posix(): p.read_bytes() for p in top.rglob("*.py")}

    added = {k for k in files(copy)} - set(files(PKG))
    assert added == {f"commands/letters/{n}" for n in LETTERS}
    assert {k: v for k, v in files(copy).items() if k not in added} == files(PKG)

    done = subprocess.run([sys.executable, "-c", PROBE, str(ROOT)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["where"].startswith(str(copy))
    assert out["cli"] == [0, "tracer: 6 letters"] and out["help"]
    assert out["bad"][0] == 2 and out["bad"][1] == \
        "fptrace: error: the word is empty: give one"
    assert out["notes"] == [True, True]
    assert out["report_help"] and "letters" in out["sections"]
    keys, tabs, bindings = out["tui"]
    assert "L" in keys and "L" in bindings and "letters" in tabs
    assert out["golden"] == ["tracer: 6 letters\n"]
    assert out["cases"] == [["commands/letters/", 1, "letters: an empty word", ["letters", " "]]]
    assert out["note_case"] == [True]  # absent for "short", said for the long word
    assert out["schema"] == ["urn:fptrace:schema:1.13", True, True]


# a throwaway engine: transformers' pass again, with a setting of its own and a note, as a second
# engine would be added (fptrace/engines/__init__.py)
ECHO = {
    "__init__.py": '''
        """The echo engine: transformers' pass, run again (a test's throwaway)."""
        ''',
    "notes.py": '''
        """The notes of the echo engine."""

        from __future__ import annotations

        from fptrace.notes import note

        ECHOED = note("echo_on", ("run", "diff"), "--echo-note on was given",
                      "echoed by the echo engine")
        ''',
    "engine.py": '''
        """The echo engine (ENGINE)."""

        from __future__ import annotations

        import dataclasses
        from typing import Any

        from fptrace.engines import Compare, Engine, RunRequest, Setting, SideB, Traced
        from fptrace.engines.echo.notes import ECHOED


        def _traced(lm: Any, prompt: Any, settings: Any, **kw: Any) -> Any:
            from fptrace.core.trace import run_trace

            t = run_trace(lm, prompt, **kw)
            on = settings.get("echo_note") == "on"
            return dataclasses.replace(t, notes=t.notes + ((ECHOED(),) if on else ()))


        def trace(request: RunRequest) -> Traced:
            from fptrace.cli.io import load, prompt_of

            prompt = prompt_of(request.prompt, request.chat)
            return Traced(_traced(load(request.opts), prompt, request.settings,
                                  top_k=request.top_k, snippet=request.snippet))


        @dataclasses.dataclass(frozen=True)
        class Pass:
            trace: Any
            points: frozenset = frozenset()

            def block(self, layer: int, n_heads: int, n_kv_heads: int) -> dict:
                return {}

            def stream(self, layer: int) -> Any:
                raise NotImplementedError


        def prepare(side: SideB) -> str:
            return side.opts.model


        def run_pass(lm: Any, path: str, prompt: Any, settings: Any) -> Pass:
            return Pass(_traced(lm, prompt, settings, snippet=int(lm.config.hidden_size)))


        ENGINE = Engine(
            name="echo", order=50, help="transformers' pass run again",
            help_b="runs transformers' pass again", takes=frozenset({"--random-weights"}),
            settings=(Setting("echo_note", "--echo-note", ("off", "on"), "off",
                              "Say that the echo engine ran."),),
            trace=trace, compare=Compare(prepare=prepare, run_pass=run_pass))
        ''',
    "examples.py": '''
        """The echo engine's bad inputs."""

        from __future__ import annotations

        from fptrace.examples import Case, Setup


        def bad_inputs(at: Setup) -> tuple[Case, ...]:
            return (Case(1, "run --engine echo: --html", ("run", "hi", "--engine", "echo",
                                                            "--html", "x.html")),)
        ''',
}

ENGINE_PROBE = '''
import importlib.util, json, sys
import fptrace  # the copy (PYTHONPATH)
from typer.testing import CliRunner
from fptrace.cli.main import app

root, model = sys.argv[1], sys.argv[2]
m = ["-m", model, "--random-weights"]
out = {}
runner = CliRunner()
r = runner.invoke(app, ["run", "The cat sat", *m, "--engine", "echo", "--echo-note", "on", "-k",
                        "2"])
out["run"] = [r.exit_code, "echoed by the echo engine" in r.stdout]
r = runner.invoke(app, ["run", "The cat sat", *m, "--engine", "echo", "--html", "x.html"])
out["html"] = [r.exit_code, r.stderr.strip()]
r = runner.invoke(app, ["run", "The cat sat", *m, "--echo-note", "on"])
out["setting"] = [r.exit_code, r.stderr.strip()]
r = runner.invoke(app, ["diff", "The cat sat", *m, "--engine-b", "echo", "--json"])
d = json.loads(r.stdout) if r.exit_code == 0 else {}
out["diff"] = [r.exit_code, [d.get(s, {}).get("label") for s in "ab"], d.get("within"),
               r.stderr[-500:]]
helps = [runner.invoke(app, [c, "--help"], terminal_width=200).stdout for c in ("run", "diff")]
out["help"] = [all(w in h for w in ("echo", "--echo-note")) for h in helps]

from fptrace.notes import NOTES
out["notes"] = "echo_on" in NOTES

spec = importlib.util.spec_from_file_location("bad_inputs", root + "/scripts/bad_inputs.py")
bad = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bad)
from fptrace.examples import Setup
out["cases"] = [[where, c.row] for where, found in bad.collected(Setup("/t", "/m"))
                for c in found if where == "engines/echo/"]
print(json.dumps(out))
'''


@pytest.mark.system
def test_a_new_engine_folder_is_found_everywhere(tmp_path):
    """The folder engines/echo/ and nothing else, in a copy of the package: `run --engine echo`
    and `diff --engine-b echo` reach it, its setting is an option of both (refused with another
    engine), an option it does not take is refused naming it, and its note and bad-input case
    are collected."""
    from conftest import tiny_gpt2

    copy = package_with(tmp_path, "engines/echo", ECHO)
    added = {p.relative_to(copy).as_posix() for p in copy.rglob("*.py")} - \
        {p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")}
    assert added == {f"engines/echo/{n}" for n in ECHO}

    done = subprocess.run([sys.executable, "-c", ENGINE_PROBE, str(ROOT), tiny_gpt2()],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["run"] == [0, True]
    assert out["html"] == [2, "fptrace: error: --html is not available with --engine echo"]
    assert out["setting"] == [2, "fptrace: error: --echo-note is not available with --engine "
                                 "transformers"]
    assert out["diff"][:3] == [0, ["transformers", "echo"], True], out["diff"]
    assert out["help"] == [True, True]
    assert out["notes"] is True
    assert out["cases"] == [["engines/echo/", 1]]


# a routed command by one folder: which experts each MoE block chose at the last position,
# through the one routing interface (core/routing.py) and no other file
EXPERTS = {
    "__init__.py": '''
        """`fptrace experts`: which experts each mixture-of-experts block chose."""
        ''',
    "cli.py": '''
        """`fptrace experts`."""

        from __future__ import annotations

        from typing import Annotated

        import typer

        from fptrace.cli.io import Group, load_for, prompt_command
        from fptrace.cli.options import ChatOptions, LoadOptions, Outputs
        from fptrace.errors import BadInput


        @prompt_command(order=999, group=Group.why, plot=False, html=False)
        def experts(
            prompt: Annotated[str | None, typer.Argument(help="The text.")] = None,
            opts: LoadOptions = LoadOptions(),
            chat: ChatOptions = ChatOptions(),
            outputs: Outputs = Outputs(),
        ) -> None:
            """The experts each MoE block chose at the last position."""
            import torch

            from fptrace.core.routing import capture_routing, moe_facts, routing_of_rows

            lm, prompt = load_for(prompt, opts, chat, outputs)
            moe = moe_facts(lm.parts, lm.config)
            if moe is None:
                raise BadInput(f"{lm.name} is not a mixture of experts")
            ids = list(lm.prepare(prompt).ids)
            with capture_routing(lm.parts, lm.config) as cap, torch.inference_mode():
                lm.model(torch.tensor([ids], device=lm.device), use_cache=False)
            routing = routing_of_rows(cap, moe, 1, len(ids), [len(ids)], "float32")[0]
            for b in routing.blocks:
                print(f"block {b.layer}: {' '.join(str(e) for e in b.experts[-1])}")
        ''',
}

EXPERTS_PROBE = '''
import contextlib, io, json, sys
import fptrace
from fptrace.cli.main import answer
model = sys.argv[1]
out = {"where": fptrace.__file__}
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    out["rc"] = answer(["experts", "The cat sat on", "-m", model])
out["lines"] = buf.getvalue().splitlines()
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    answer(["run", "The cat sat on", "-m", model, "--json"])
run = json.loads(buf.getvalue())
out["run"] = [f"block {b['layer']}: " + " ".join(str(e) for e in b["experts"][-1])
              for b in run["routing"]["blocks"]]
print(json.dumps(out))
'''


@pytest.mark.system
def test_a_routed_command_is_one_folder(tmp_path):
    """A throwaway command that reads the routing (commands/experts/, two files and no other
    edit) runs on a tiny MoE model and names the experts `run` reports for each block."""
    from conftest import make_moe_folder

    copy = package_with(tmp_path, "commands/experts", EXPERTS)
    model, _ = make_moe_folder(tmp_path)
    done = subprocess.run([sys.executable, "-c", EXPERTS_PROBE, str(model)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["where"].startswith(str(copy))
    assert out["rc"] == 0 and out["lines"] and out["lines"] == out["run"], out
