"""The first screen a newcomer reads: `fptrace --help` one line a command in panels, `fptrace
--version` without torch, every command's --help ending with examples that the transcript test
runs, and no hard line break inside a paragraph of any help text."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fptrace.cli.io import COMMAND_MARK, Group
from fptrace.cli.main import COMMANDS, app

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import transcripts  # noqa: E402


def fptrace(*args: str, columns: int = 100) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS=str(columns), TERM="dumb", FPTRACE_SERVER="off")
    return subprocess.run([sys.executable, "-m", "fptrace", *args], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.fixture(scope="module", params=[80, 100, 120])
def top_help(request):
    r = fptrace("--help", columns=request.param)
    assert r.returncode == 0, r.stderr
    return request.param, r.stdout


@pytest.mark.system
def test_every_command_is_one_line_in_its_panel(top_help):
    width, text = top_help
    lines = text.splitlines()
    assert all(len(line.rstrip()) <= width for line in lines)
    for group in Group:
        start = next(i for i, line in enumerate(lines) if line.startswith(f"╭─ {group.value} "))
        end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("╰"))
        rows = [line.strip("│ ").split()[0] if line.strip("│ ") else "" for line in
                lines[start + 1:end]]
        want = [name for _, name, fn in COMMANDS if getattr(fn, COMMAND_MARK)["group"] is group]
        assert rows == want, (width, group, lines[start:end + 1])  # no continuation lines
    ordered = [line.split()[1] for line in lines if re.match(r"│ [a-z]+ {2,}\S", line)]
    assert sorted(ordered) == sorted(name for _, name, _ in COMMANDS)


@pytest.mark.system
def test_version_names_the_parts_without_importing_torch():
    code = ("import sys; sys.argv = ['fptrace', '--version']\n"
            "from fptrace.client import main\n"
            "main()\n"
            "heavy = {'torch', 'transformers', 'typer', 'rich'} & set(sys.modules)\n"
            "assert not heavy, heavy\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    from importlib.metadata import version

    assert lines[:3] == [f"fptrace {version('fptrace')}", f"torch {version('torch')}",
                         f"transformers {version('transformers')}"]
    for name in ("ray", "torchao", "xllamacpp", "playwright"):
        assert any(line.startswith(f"{name} ") for line in lines), name
    assert any("the page's browser test" in line for line in lines)
    for flag in ("--version", "-V"):
        r = fptrace(flag)
        assert r.returncode == 0 and r.stdout.splitlines() == lines
    from typer.testing import CliRunner

    assert CliRunner().invoke(app, ["--version"]).stdout.splitlines() == lines  # in a server


def _run_by_transcripts() -> set[str]:
    """The command lines the transcript test runs, each without what it pipes or redirects."""
    out = set()
    for example in transcripts.all_examples():
        for command, _ in example.commands:
            first = re.split(r" \||\s+2?>", command.splitlines()[0])[0]
            out.add(first.split("#")[0].strip())
    return out


def test_every_command_ends_its_help_with_examples_the_transcripts_run():
    """tui and serve own the terminal or are the server: their examples are the lines of
    their docs page, not console examples."""
    run = _run_by_transcripts()
    for _, name, fn in COMMANDS:
        mark = getattr(fn, COMMAND_MARK)
        assert mark["examples"], name
        for example in mark["examples"]:
            if mark["resident"]:
                assert example in run, (name, example)
            else:
                page = (ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8")
                assert f"$ {example}\n" in page or f"$ {example} " in page, (name, example)
        # in this process (a subprocess a command: 20 s for what the other tests here already
        # check through the front door)
        r = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "200", "TERM": "dumb"})
        assert r.exit_code == 0, r.output
        tail = r.stdout[r.stdout.rindex("Examples:"):]
        for example in mark["examples"]:
            assert f"$ {example}" in tail, (name, example)


def test_no_hard_line_break_inside_a_paragraph_of_any_help():
    import typer.main

    group = typer.main.get_command(app)
    texts = [("fptrace", group.help or "")]
    for name, cmd in group.commands.items():
        texts.append((name, cmd.help or ""))
        texts += [(f"{name} {p.name}", getattr(p, "help", None) or "") for p in cmd.params]
    texts += [(f"fptrace {p.name}", getattr(p, "help", None) or "") for p in group.params]
    for where, text in texts:
        for paragraph in text.split("\n\n"):
            assert "\n" not in paragraph.strip(), (where, paragraph)
    # and the first paragraph is one short line: at 80 columns, 80 - the panel and name column
    for name, cmd in group.commands.items():
        assert len(cmd.short_help or "") <= 64, (name, cmd.short_help)


@pytest.mark.system
def test_a_command_help_reflows_at_every_width():
    for width in (60, 80, 120):
        r = fptrace("diff", "--help", columns=width)
        assert r.returncode == 0
        lines = r.stdout.splitlines()
        assert all(len(line.rstrip()) <= width for line in lines), width
        prose = " ".join(line.strip() for line in lines[:12])
        assert "Do two runs compute the same?" in prose
