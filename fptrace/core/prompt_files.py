"""Small input files a command reads beside its prompt: a list of prompts (`ablate --mean-over`)
and contrastive pairs (`steer --pairs`). Read whole and checked before any forward pass; a
mistake names the file and the line."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fptrace.errors import BadInput
from fptrace.jsontext import loads
from fptrace.userfiles import read_text

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel


def _read_lines(path: str, what: str) -> list[tuple[int, str]]:
    """(line number, text) of every non-blank line of a UTF-8 file."""
    p = Path(path)
    if not p.exists():
        raise BadInput(f"{what} {path}: no such file")
    try:
        text = read_text(p, "utf-8-sig", what)
    except UnicodeDecodeError as e:
        raise BadInput(f"{what} {path}: not valid UTF-8 (byte {e.start})") from None
    except OSError as e:
        raise BadInput(f"{what} {path}: cannot read it ({e.strerror or e})") from None
    return [(n, line.rstrip("\r")) for n, line in enumerate(text.split("\n"), start=1)
            if line.strip()]


def _object(path: str, n: int, line: str, what: str, example: str) -> dict:
    try:
        obj = loads(line)
    except json.JSONDecodeError as e:
        raise BadInput(f"{what} {path}:{n}: not JSON ({e.msg}); each line is one object such "
                       f"as {example}") from None
    if not isinstance(obj, dict):
        raise BadInput(f"{what} {path}:{n}: a JSON {type(obj).__name__}, not an object such as "
                       f"{example}")
    return obj


def read_prompts(path: str, what: str) -> list[str]:
    """Prompts, one a line (a .jsonl file: one object with a "prompt" string a line)."""
    return [p for _, p in prompts_at(path, what)]


def prompts_at(path: str, what: str) -> list[tuple[str, str]]:
    """(where, prompt) of each line: where names the option, the file and the line."""
    lines = _read_lines(path, what)
    if not path.endswith(".jsonl"):
        prompts = [(f"{what} {path}:{n}", line) for n, line in lines]
    else:
        example = '{"prompt": "The capital of France is"}'
        prompts = []
        for n, line in lines:
            value = _object(path, n, line, what, example).get("prompt")
            if not isinstance(value, str) or not value:
                raise BadInput(f"{what} {path}:{n}: no \"prompt\" string; each line is one "
                               f"object such as {example}")
            prompts.append((f"{what} {path}:{n}", value))
    if not prompts:
        raise BadInput(f"{what} {path}: no prompts in it")
    return prompts


def encode_listed(lm: LoadedModel, texts: Sequence[Any], wheres: Sequence[str]) -> list[list[int]]:
    """The ids of prompts read from a file or an option, a mistake naming where each came from
    (`--pairs f.jsonl:3 (positive)`) and suggesting no option the command lacks (--truncate)."""
    from fptrace.errors import PromptTooLong

    out = []
    for text, where in zip(texts, wheres):
        try:
            out.append(lm.encode(text))
        except PromptTooLong as e:
            raise BadInput(f"{where}: {e.tokens} tokens, but {lm.name} reads at most "
                           f"{e.limit}; shorten it") from None
        except BadInput as e:
            raise BadInput(f"{where}: {e}") from None
    return out


def read_pairs(path: str, what: str = "--pairs") -> list[tuple[str, str]]:
    """Contrastive pairs: JSON Lines of {"positive": ..., "negative": ...}."""
    return [(pos, neg) for _, pos, neg in pairs_at(path, what)]


def pairs_at(path: str, what: str = "--pairs") -> list[tuple[str, str, str]]:
    """(where, positive, negative) of each line: where names the option, the file and the line."""
    example = '{"positive": "I love it", "negative": "I hate it"}'
    pairs = []
    for n, line in _read_lines(path, what):
        obj = _object(path, n, line, what, example)
        pos, neg = obj.get("positive"), obj.get("negative")
        if not (isinstance(pos, str) and pos and isinstance(neg, str) and neg):
            raise BadInput(f"{what} {path}:{n}: needs non-empty \"positive\" and \"negative\" "
                           f"strings, as in {example}")
        pairs.append((f"{what} {path}:{n}", pos, neg))
    if not pairs:
        raise BadInput(f"{what} {path}: no pairs in it; each line is one object such as "
                       f"{example}")
    return pairs
