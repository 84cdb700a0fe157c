"""`fptrace report`: one self-contained HTML file (render/page.py builds it from the sections
the command folders offer, cli/sections.py): where it may be written, and writing it."""

from __future__ import annotations

import os

from fptrace.errors import BadInput


def check_out(path: str, force: bool = False) -> None:
    from fptrace.atomic import check_target

    check_target(path, "--out", "report.html", force)
    if os.path.splitext(path)[1].lower() not in (".html", ".htm"):
        raise BadInput(f"--out {path}: a report is an .html file")


def write_report(path: str, text: str) -> None:
    from fptrace.atomic import write_text_atomic

    write_text_atomic(path, text, ".html")
