"""ruff and mypy on fptrace/, against a baseline that can only shrink.

Each tool's findings are counted by rule (ruff's codes, mypy's error codes) and compared with
`.ci/lint-baseline.json`: a rule with more findings than its baseline fails, and its findings
are listed (file:line: message) so the new one can be found; a rule with fewer says so, and
`--update` writes the lower numbers (it never raises one). `make test` (and so CI) runs it.

Usage: python scripts/lint.py [--update]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / ".ci" / "lint-baseline.json"
BIN = Path(sys.executable).parent


def ruff() -> list[tuple[str, str]]:
    """(rule, 'file:line: message') of every ruff finding."""
    out = subprocess.run([str(BIN / "ruff"), "check", "fptrace", "--output-format", "json",
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--update", action="store_true",
                    help="write the lower counts into the baseline (never a higher one)")
    args = ap.parse_args()
    base = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
    failed, now = False, {}
    for tool, run in (("ruff", ruff), ("mypy", mypy)):
        found = run()
        counts = Counter(code for code, _ in found)
        where = defaultdict(list)
        for code, text in found:
            where[code].append(text)
        old = base.get(tool, {})
        for code in sorted(set(counts) | set(old)):
            n, b = counts.get(code, 0), old.get(code, 0)
            if n > b and tool not in base:
                failed = True  # no baseline yet: counted, not listed
            elif n > b:
                failed = True
                print(f"lint: {tool} {code}: {n} findings, the baseline allows {b}:",
                      *where[code], sep="\n  ")
            elif n < b:
                print(f"lint: {tool} {code}: {n} findings, {b} in the baseline "
                      "(python scripts/lint.py --update lowers it)")
        now[tool] = {c: min(counts.get(c, 0), old.get(c, counts.get(c, 0)))
                     for c in sorted(set(counts) | set(old)) if counts.get(c, 0)}
        print(f"lint: {tool}: {sum(counts.values())} findings "
              f"(baseline {sum(old.values())})")
    if args.update:
        if failed and base:
            print("lint: not updated: a count above its baseline is fixed, not written down")
            return 1
        BASELINE.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"lint: wrote {BASELINE.relative_to(ROOT)}")
        return 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
