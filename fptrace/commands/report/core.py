"""`fptrace report`: one self-contained HTML file (render/page.py builds it from the sections
the command folders offer, cli/sections.py): where it may be written, and writing it."""

from __future__ import annotations


def check_out(path: str, force: bool = False) -> None:
    from fptrace.cli.page import check_page

    check_page(path, "--out", force)


def write_report(path: str, text: str) -> None:
    from fptrace.atomic import write_text_atomic

    write_text_atomic(path, text, ".html")
