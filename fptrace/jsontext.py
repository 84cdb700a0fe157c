"""JSON read from a user's file or option, in one place.

`json.loads` recurses once per level of nesting: a line of 100,000 nested lists raises
RecursionError (and a few hundred levels, parsed fine, can raise it later in code that walks the
value). Every reader of JSON that a user hands fptrace (prompt files, `--messages`, `--pairs`,
statistics files, traces, batch outputs) goes through `loads`, which refuses nesting beyond
MAX_DEPTH levels as the JSONDecodeError any malformed JSON raises: each caller's message already
names its file and line, and a line of a prompt file stays one failed record like any other.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64  # fptrace's own files nest 6 levels; a conversation or a record far fewer


def loads(text: str | bytes) -> Any:
    """json.loads, with nesting deeper than MAX_DEPTH refused as a json.JSONDecodeError whose
    position is where the limit is passed."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")
    try:
        value = json.loads(text)
    except RecursionError:
        value, deep = None, True
    else:
        deep = depth(value) > MAX_DEPTH
    if deep:
        raise json.JSONDecodeError(f"nested deeper than {MAX_DEPTH} levels", text,
                                   _too_deep_at(text))
    return value


def depth(value: Any) -> int:
    """How many lists and objects deep value nests (0 for a string or a number), without
    recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            return d
        stack.extend((x, d + 1) for x in v if isinstance(x, (list, dict)))
    return deepest


def _too_deep_at(text: str) -> int:
    """The offset of the bracket that opens level MAX_DEPTH + 1 (strings skipped)."""
    level, in_string, escaped = 0, False, False
    for i, c in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            level += 1
            if level > MAX_DEPTH:
                return i
        elif c in "]}":
            level -= 1
    return 0


__all__ = ["MAX_DEPTH", "depth", "loads"]
