"""The console examples of README.md and docs/*.md are real output: this script runs every
`$ command` of every ```console block and writes what it printed under it.

    python scripts/transcripts.py            # rewrite the outputs in place
    python scripts/transcripts.py README.md  # only the pages named
    python scripts/transcripts.py --check    # exit 1 and show the first difference

tests/test_transcripts.py runs the same check in the suite. Commands run in a scratch folder
that holds a link to prompts/, on one compute thread (OMP_NUM_THREADS=1: the same digits on
every machine), with COLUMNS=100 unless the command sets it, stdout only (add `2>&1` to a
command to show its stderr). Before comparing, what differs from run to run or
machine to machine is masked on both sides: durations, rates, free memory and install paths.
Every other number may differ by one unit in its last printed digit and no more (`same`): a
float32 sum that lands near a rounding boundary rounds the other way when another CPU's vector
instructions add it in another order (an AVX-512 machine prints +0.528 where this one prints
+0.527); anything larger is a real change. Pages whose numbers depend on the CPU's kernels
altogether say so in a comment above the block (LOOSE): only the text around them is compared;
a table whose rows themselves differ between CPUs says so too (LOOSE_ROWS): its rows are compared
by their count and their number of fields.

Both run the commands through a resident server of their own (`fptrace serve` on a private
socket, stopped at the end): each model is loaded once instead of once per command, and the
output is what the command prints by itself (tests/test_serve.py holds the two equal). With
FPTRACE_SERVER=off every command runs in a process of its own, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ("README.md", "docs/*.md")
WIDTH = "100"
# every example computes on one thread: sums split over threads round differently in their
# last bits, which can move a printed digit (an output then depended on the machine's cores)
THREADS = "1"

_MASKS = (
    (re.compile(r"\d[\d,]*(\.\d+)? ?(ms|s|µs)\b"), "<time>"),
    (re.compile(r"\d[\d,]*(\.\d+)? (tokens|prompts)/s"), r"<rate> \2/s"),
    (re.compile(r"\d+(\.\d+)? ([KMGT]i)?B free"), "<mem> free"),
    (re.compile(r"\S*site-packages/"), "<site-packages>/"),
    (re.compile(r"\d+:\d\d:\d\d"), "<clock>"),
    # rounding residuals (a sum against the model's logit, a recomputation against the model):
    # below 1e-5 they depend on the CPU's vector instructions, not on fptrace
    (re.compile(r"[+-]?\d\.\d\de-(0[5-9]|[1-9]\d)\b"), "<residual>"),
)
# the ms column of generate's step lines: a bare number with one decimal before the text
_STEP = re.compile(r"^(\s*\d+ .*?)\s+\d+\.\d(\s{2})")


# the header's weights row holds an install path, folded at a place that depends on its length,
# and the header panel is as wide as that row: its borders and right padding vary with the path
_WEIGHTS = re.compile(r"^│ weights\s")
_FOLDED = re.compile(r"^│ {5,}\S")
_RULE = re.compile(r"─{2,}")
_PADDED = re.compile(r"\s+│$")


def mask(text: str) -> str:
    out = []
    in_weights = False
    for line in text.splitlines():
        if _WEIGHTS.match(line):
            in_weights = True
            out.append("│ weights <path>")
            continue
        if in_weights and _FOLDED.match(line):
            continue
        in_weights = False
        line = _STEP.sub(r"\1 <ms>\2", line)
        for pattern, repl in _MASKS:
            line = pattern.sub(repl, line)
        line = _PADDED.sub(" │", _RULE.sub("─", line.rstrip()))
        out.append(line)
    return "\n".join(out).strip("\n")


@dataclass
class Example:
    path: Path
    start: int  # index of the line after "```console"
    end: int  # index of the closing "```"
    commands: list[tuple[str, str]]  # (command, output)
    # the page says, in a comment right above the block, that its numbers vary with the CPU
    # (half-precision kernels): then only the text around the numbers is compared
    loose: bool = False
    # ... and that which rows a table lists varies too (the channels that moved most under
    # bfloat16): then a table's rows are compared by their count and their number of fields
    rows_vary: bool = False


LOOSE_ROWS = "<!-- numbers and rows vary with the CPU"
LOOSE = ("<!-- numbers vary with the CPU", LOOSE_ROWS)
_TABLE_RULE = re.compile(r"^\s*─+\s*$")
_NUMBER = re.compile(r"[+-]?\d[\d,]*(\.\d+)?(e[+-]?\d+)?")


def compared(example: Example, text: str) -> str:
    """What the check compares: the masked text; for a loose example, without its numbers (a
    masked rounding residual is a number too) and with runs of spaces as one (column widths
    follow the numbers)."""
    text = mask(text)
    if not example.loose:
        return text
    out, in_table = [], False
    for line in text.splitlines():
        if in_table and line.strip():
            out.append(f"<row of {len(line.split())} fields>")
            continue
        in_table = example.rows_vary and bool(_TABLE_RULE.match(line))
        out.append(" ".join(_NUMBER.sub("<n>", line.replace("<residual>", "<n>"))
                            .replace("↑", "").replace("↓", "").split()))
    return "\n".join(out)


def _last_unit(number: str) -> float:
    """One unit in the last printed digit of a number as printed ("+0.527": 0.001, "1.5e-03":
    1e-04, "1,154": 1)."""
    mantissa, _, exponent = number.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


# a version is a name, not a rounded figure: no tolerance ("schema version 1.9" is not 1.8)
_VERSION = re.compile(r'(version|_version": ")\s*$')


def _within_last_digit(a: str, b: str) -> bool:
    """Two masked texts that differ only in numbers each one unit apart in its last printed
    digit at most (runs of spaces as one: a column may widen by a digit); a version's number
    (after `version` or `_version": "`) exactly equal."""
    la, lb = a.splitlines(), b.splitlines()
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb, strict=True):
        if " ".join(_NUMBER.sub("<n>", x).split()) != " ".join(_NUMBER.sub("<n>", y).split()):
            return False
        for m, n in zip(_NUMBER.finditer(x), _NUMBER.finditer(y), strict=True):
            u, v = m.group(0).replace(",", ""), n.group(0).replace(",", "")
            if u != v and _VERSION.search(x[:m.start()]):
                return False
            if u != v and abs(float(u) - float(v)) > max(_last_unit(u), _last_unit(v)) * 1.000001:
                return False
    return True


def same(example: Example, got: str, want: str) -> bool:
    """Whether a command's output is its page's: the compared texts equal, or (outside a loose
    example) equal but for numbers one unit apart in their last printed digit."""
    a, b = compared(example, got), compared(example, want)
    return a == b or (not example.loose and _within_last_digit(a, b))


def _commands(lines: list[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            raise ValueError(f"a console block must start with '$ ': {lines[i]!r}")
        cmd = lines[i][2:]
        i += 1
        while True:  # a command goes on while its quotes are open
            try:
                shlex.split(cmd)
                break
            except ValueError:
                cmd += "\n" + lines[i]
                i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("$ "):
            body.append(lines[i])
            i += 1
        out.append((cmd, "\n".join(body)))
    return out


def examples(path: Path) -> list[Example]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```console":
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            above = lines[max(0, i - 3):i]
            loose = any(line.startswith(LOOSE) for line in above)
            rows_vary = any(line.startswith(LOOSE_ROWS) for line in above)
            found.append(Example(path, i + 1, j, _commands(lines[i + 1:j]), loose, rows_vary))
            i = j
        i += 1
    return found


def all_examples() -> list[Example]:
    paths = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
    return [e for p in paths for e in examples(p)]


@contextlib.contextmanager
def resident_server():
    """A server on a private socket for the commands run inside (nothing with
    FPTRACE_SERVER=off); stopped at the end, by its process id if asking is not enough."""
    if os.environ.get("FPTRACE_SERVER", "").lower() == "off":
        yield
        return
    folder = Path(tempfile.mkdtemp(prefix="fptrace-serve-"))
    sock = folder / "run" / "serve.sock"
    env = dict(os.environ, FPTRACE_SOCKET=str(sock))
    fptrace = [sys.executable, "-m", "fptrace"]
    subprocess.run([*fptrace, "serve", "--idle-timeout", "3600"], env=env, check=True,
                   capture_output=True, timeout=300)
    status = subprocess.run([*fptrace, "serve", "--status", "--json"], env=env,
                            capture_output=True, text=True, timeout=60)
    pid = json.loads(status.stdout)["pid"]
    old = os.environ.get("FPTRACE_SOCKET")
    os.environ["FPTRACE_SOCKET"] = str(sock)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("FPTRACE_SOCKET", None)
        else:
            os.environ["FPTRACE_SOCKET"] = old
        subprocess.run([*fptrace, "serve", "--stop"], env=env, capture_output=True, timeout=120)
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, 9)
        shutil.rmtree(folder, ignore_errors=True)


def run(command: str, scratch: Path) -> str:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.setdefault("COLUMNS", WIDTH)
    if not command.lstrip().startswith("COLUMNS="):
        env["COLUMNS"] = WIDTH
    env["TERM"] = "dumb"
    env["OMP_NUM_THREADS"] = THREADS
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=scratch, env=env,
                          capture_output=True, text=True, timeout=600)
    return done.stdout.rstrip("\n")


def scratch_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="fptrace-transcripts-"))
    (folder / "prompts").symlink_to(ROOT / "prompts")
    return folder


def main() -> int:
    """Rewrite the examples of every page, or of the pages named (`python scripts/transcripts.py
    README.md docs/steer.md`); --check only compares."""
    check = "--check" in sys.argv
    named = [(ROOT / a).resolve() for a in sys.argv[1:] if not a.startswith("--")]
    scratch = scratch_folder()
    with resident_server():
        bad = rewrite(named, check, scratch)
    return 1 if bad else 0


def rewrite(named: list[Path], check: bool, scratch: Path) -> int:
    """Run the examples of the pages (those named, or all) and rewrite them (or, with check,
    count those that print something else now)."""
    bad = 0
    try:
        for path in [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md")):
            if named and path.resolve() not in named:
                continue
            lines = path.read_text(encoding="utf-8").splitlines()
            found = examples(path)
            outputs = [[run(cmd, scratch) for cmd, _ in ex.commands] for ex in found]  # in order
            for ex, got_all in reversed(list(zip(found, outputs))):  # replace from the end
                new: list[str] = []
                for (cmd, want), got in zip(ex.commands, got_all):
                    if check and not same(ex, got, want):
                        bad += 1
                        print(f"{path.relative_to(ROOT)}:{ex.start}: `{cmd.splitlines()[0]}` "
                              "prints something else now", file=sys.stderr)
                    new += [f"$ {cmd}"] + (got.splitlines() if got else [])
                lines[ex.start:ex.end] = [line.rstrip() for line in new]
            if not check:
                path.write_text("\n".join(lines) + "\n", encoding="utf-8")
                print(f"updated {path.relative_to(ROOT)}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return bad


if __name__ == "__main__":
    sys.exit(main())
