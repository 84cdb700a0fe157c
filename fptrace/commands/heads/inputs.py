"""What `fptrace heads` reads before loading a model: its prompts (files, folders or texts;
the shipped prompts/ by default) with their subjects, and --induction NxLEN."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from fptrace.errors import BadInput, param
from fptrace.numbers import parse_int


def parse_induction(text: str) -> tuple[int, int]:
    """`8x64` -> (8, 64); `0` -> (0, 0)."""
    s = text.strip().lower()
    if s == "0":
        return 0, 0
    if s.count("x") != 1:
        raise BadInput(f"{param('induction')} {text!r}: give N×LEN as NxLEN (8x64), or 0 for none")
    n, length = s.split("x")
    return parse_int(n, "--induction N", low=0), parse_int(length, "--induction LEN", low=2)


def read_prompts(specs: Sequence[str]) -> tuple[list[Any], list[str | None]]:
    """The prompts and their subjects (a .jsonl line's "subject"; None elsewhere): each spec a
    file or folder (core/inputs.py's formats) or else a prompt's text."""
    from fptrace.commands.heads.core import shipped_prompts
    from fptrace.core.inputs import read_inputs

    if not specs:
        if not os.path.isdir(shipped_prompts()):
            raise BadInput("no prompts given and the shipped prompts/ folder is not here: give "
                           "prompts (texts, .txt or .jsonl files)")
        specs = [shipped_prompts()]
    texts: list[Any] = []
    subjects: list[str | None] = []
    for spec in specs:
        if os.path.exists(spec):
            for it in read_inputs([spec]):
                if it.error:
                    raise BadInput(f"{it.source}: {it.error}")
                texts.append(it.checked())
                subject = it.extra.get("subject")
                if subject is not None and not isinstance(subject, str):
                    raise BadInput(f"{it.source}: \"subject\" must be a string")
                subjects.append(subject)
        else:
            from fptrace.models.tokenizers import check_prompt

            texts.append(check_prompt(spec))
            subjects.append(None)
    return texts, subjects


__all__ = ["parse_induction", "read_prompts"]
