"""ruff and mypy on fptrace/, ruff on tests/ and the names `Any` in fptrace/, against a
baseline that can only shrink.

Each tool's findings are counted by rule (ruff's codes, mypy's error codes; `Any`: the name
`Any` as a token of fptrace/**/*.py, reported per 1,000 lines too) and compared with
`.ci/lint-baseline.json` (sections "ruff", "ruff-tests", "mypy", "any"): a rule with more
findings than its baseline fails, and its findings are listed (file:line: message) so the new
one can be found; a rule with fewer says so, and `--update` writes the lower numbers (it never
raises one; a section the baseline does not have yet is written as it stands). `make test`
(and so CI) runs it.

Usage: python scripts/lint.py [--update]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tokenize
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / ".ci" / "lint-baseline.json"
BIN = Path(sys.executable).parent


def ruff(folder: str = "fptrace") -> list[tuple[str, str]]:
    """(rule, 'file:line: message') of every ruff finding in folder (pyproject's rules)."""
    out = subprocess.run([str(BIN / "ruff"), "check", folder, "--output-format", "json",
                          "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        sys.exit(f"lint: ruff failed: {out.stderr.strip()}")
    found = json.loads(out.stdout or "[]")
    return [(f["code"] or "syntax", f"{Path(f['filename']).relative_to(ROOT)}:"
             f"{f['location']['row']}: {f['message']}") for f in found]


MYPY_LINE = re.compile(r"^(?P<where>[^:]+:\d+): error: (?P<msg>.*?)(?:  \[(?P<code>[a-z-]+)\])?$")


def mypy() -> list[tuple[str, str]]:
    """(error code, 'file:line: message') of every mypy error."""
    # mypy's worker processes (the same findings; 45 s instead of 59 s on 2 cores, no cache)
    workers = str(min(4, os.cpu_count() or 1))
    out = subprocess.run([sys.executable, "-m", "mypy", "fptrace", "--num-workers", workers,
                          "--no-error-summary", "--hide-error-context", "--no-pretty"], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode not in (0, 1):
        sys.exit(f"lint: mypy failed: {(out.stderr or out.stdout).strip()[-2000:]}")
    found = []
    for line in out.stdout.splitlines():
        m = MYPY_LINE.match(line)
        if m:
            found.append((m["code"] or "misc", f"{m['where']}: {m['msg']}"))
    return found


def ruff_tests() -> list[tuple[str, str]]:
    """ruff's findings in tests/, held to a baseline of their own."""
    return ruff("tests")


LINES = {"n": 0}  # fptrace's lines, counted by any_names() for the density it prints


def any_names() -> list[tuple[str, str]]:
    """('Any', 'file:line: Any') for every name `Any` in fptrace/**/*.py (tokens: an import, an
    annotation, typing.Any; not a comment or a docstring)."""
    found, lines = [], 0
    for path in sorted((ROOT / "fptrace").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines += len(text.splitlines())
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.NAME and tok.string == "Any":
                found.append(("Any", f"{path.relative_to(ROOT)}:{tok.start[0]}: Any"))
    LINES["n"] = lines
    return found


def changed_files() -> set[str]:
    """The files git says differ from HEAD (tracked or new): where a new `Any` is likely."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                         capture_output=True, text=True)
    return {line[3:].split(" -> ")[-1] for line in out.stdout.splitlines()}


def summary(tool: str, total: int, base: int) -> str:
    """The closing line of one tool's count."""
    if tool == "any":
        per = 1000 * total / max(LINES["n"], 1)
        return (f"lint: any: {total} names Any in {LINES['n']:,} lines of fptrace/, "
                f"{per:.1f} per 1,000 (baseline {base})")
    return f"lint: {tool}: {total} findings (baseline {base})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--update", action="store_true",
                    help="write the lower counts into the baseline (never a higher one)")
    args = ap.parse_args()
    base = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
    failed, unrecorded, now = False, False, {}
    tools = (("ruff", ruff), ("ruff-tests", ruff_tests), ("any", any_names), ("mypy", mypy))
    for tool, run in tools:
        found = run()
        counts = Counter(code for code, _ in found)
        where = defaultdict(list)
        for code, text in found:
            where[code].append(text)
        old = base.get(tool, {})
        for code in sorted(set(counts) | set(old)):
            n, b = counts.get(code, 0), old.get(code, 0)
            if n > b and tool not in base:
                unrecorded = True  # no baseline yet: counted, not listed; --update writes it
            elif n > b and tool == "any":  # 1,700 sites: only those of the changed files
                failed = True
                changed = changed_files()
                print(f"lint: any: {n} names Any, the baseline allows {b}; in the files changed "
                      "since HEAD (else: git diff | grep -w Any):",
                      *(t for t in where[code] if t.split(":")[0] in changed), sep="\n  ")
            elif n > b:
                failed = True
                print(f"lint: {tool} {code}: {n} findings, the baseline allows {b}:",
                      *where[code], sep="\n  ")
            elif n < b:
                print(f"lint: {tool} {code}: {n} findings, {b} in the baseline "
                      "(python scripts/lint.py --update lowers it)")
        now[tool] = {c: min(counts.get(c, 0), old.get(c, counts.get(c, 0)))
                     for c in sorted(set(counts) | set(old)) if counts.get(c, 0)}
        print(summary(tool, sum(counts.values()), sum(old.values())))
        if tool not in base and counts:
            print(f"lint: {tool}: no baseline yet (python scripts/lint.py --update writes it)")
    if args.update:
        if failed and base:
            print("lint: not updated: a count above its baseline is fixed, not written down")
            return 1
        BASELINE.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"lint: wrote {BASELINE.relative_to(ROOT)}")
        return 0
    return 1 if failed or unrecorded else 0


if __name__ == "__main__":
    sys.exit(main())
