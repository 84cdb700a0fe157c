"""Write docs/notes.md from fptrace/notes.py (the one place every note is written).

Usage: python scripts/notes_doc.py
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fptrace.notes import markdown  # noqa: E402

if __name__ == "__main__":
    path = os.path.join(ROOT, "docs", "notes.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(markdown())
    print(f"wrote {path}", file=sys.stderr)
