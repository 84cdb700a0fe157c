"""A prompt as the model takes it: plain text (with whatever begin-of-text token the tokenizer
adds), token ids given as they are, or a conversation that the model's own chat template turns
into its prompt.

`Chat` is the conversation (`fptrace run --chat TEXT`, `--system TEXT`, `--messages FILE`);
`Prepared` is what a command traces: the ids, the text they spell, which of them the chat
template added, and what `--truncate` dropped. `LoadedModel.prepare()` makes one; `spans()` gives
each token's character span in that text, which is how a subject inside the prompt is found
(core/fragments.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fptrace.errors import BadInput, PromptTooLong, param
from fptrace.jsontext import loads

ROLES = ("system", "user", "assistant", "tool")
ROLES_HINT = "each message is {\"role\": \"system\"|\"user\"|\"assistant\", \"content\": TEXT}"


def too_long(tokens: int, limit: int, model: str, truncate: bool = True) -> PromptTooLong:
    """The refusal of a prompt of `tokens` tokens for a model that reads at most `limit`, in the
    same words on every engine (truncate: whether --truncate is there to offer)."""
    hint = f" or pass --truncate to keep the last {limit} tokens" if truncate else ""
    return PromptTooLong(f"the prompt is {tokens} tokens but {model} reads at most {limit}; "
                         f"shorten it{hint}", tokens, limit)


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class Chat:
    """A conversation: the chat template renders it, with the prompt of the assistant's turn
    added at the end (`add_generation_prompt`), so the traced next token is the assistant's
    first."""

    messages: tuple[Message, ...]

    @classmethod
    def of(cls, user: str, system: str | None = None) -> Chat:
        """One user message, after an optional system message."""
        first = (Message("system", system),) if system is not None else ()
        return cls(first + (Message("user", user),))

    def as_dicts(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.content} for m in self.messages]


@dataclass(frozen=True)
class Prepared:
    """A prompt ready to trace."""

    ids: tuple[int, ...]  # what the model reads (after --truncate)
    text: str  # the text the ids spell: as given, the chat template's output, or decoded ids
    template: tuple[bool, ...] = ()  # per id: added by the chat template (empty: none)
    dropped: int = 0  # tokens --truncate removed from the start
    chat: bool = False  # the text is a chat template's rendering
    from_ids: bool = False  # the prompt was given as token ids: `text` is their decoding
    seconds: float | None = None  # the tokenizer's time on this text, warm; None for ids given

    def flags(self) -> tuple[bool, ...]:
        """One template flag per id (all False for a plain prompt)."""
        return self.template or (False,) * len(self.ids)


Prompt = str | Sequence[int] | Chat | Prepared


def parse_messages(data: Any, where: str, lines: Sequence[int] = ()) -> Chat:
    """A Chat from a parsed JSON value: a non-empty list of {"role": str, "content": str}.
    lines: the line each message starts on, for the message of a mistake."""
    if not isinstance(data, list) or not data:
        raise BadInput(f"{where}: expected a non-empty JSON list of messages; {ROLES_HINT}")
    out = []
    for k, item in enumerate(data):
        at = f"{where}, line {lines[k]} (message {k + 1})" if k < len(lines) else \
            f"{where}, message {k + 1}"
        if not isinstance(item, dict):
            raise BadInput(f"{at}: expected an object, got {type(item).__name__}; {ROLES_HINT}")
        missing = [key for key in ("role", "content") if key not in item]
        if missing:
            raise BadInput(f"{at}: no {' or '.join(repr(m) for m in missing)}; {ROLES_HINT}")
        extra = sorted(set(item) - {"role", "content"})
        if extra:
            raise BadInput(f"{at}: unexpected key {extra[0]!r}; {ROLES_HINT}")
        role, content = item["role"], item["content"]
        if not isinstance(role, str) or not role.strip():
            raise BadInput(f"{at}: 'role' must be a non-empty string, got {role!r}")
        if role not in ROLES:
            raise BadInput(f"{at}: unknown role {role!r}; a chat template knows "
                           + ", ".join(ROLES[:-1]) + f" and {ROLES[-1]}")
        if not isinstance(content, str):
            raise BadInput(f"{at}: 'content' must be a string, got {type(content).__name__}")
        out.append(Message(role, content))
    return Chat(tuple(out))


def read_messages(path: str) -> Chat:
    """The conversation in a JSON file (`--messages FILE`); a mistake names the line."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"no such file: {path}" if not p.exists() else
                       f"{param('messages')} {path} is not a file")
    from fptrace.userfiles import read_text

    try:
        text = read_text(p, "utf-8-sig", param("messages"))
    except UnicodeDecodeError as e:
        raise BadInput(f"{param('messages')} {path}: not UTF-8 text (byte {e.start})") from None
    try:
        data = loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"{param('messages')} {path}, line {e.lineno}: not JSON ({e.msg})") from None
    lines = _item_lines(text) if isinstance(data, list) else []
    return parse_messages(data, f"--messages {path}", lines)


def _item_lines(text: str) -> list[int]:
    """The line on which each element of a top-level JSON list starts."""
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    lines: list[int] = []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return lines
        lines.append(text.count("\n", 0, i) + 1)
        _, i = decoder.raw_decode(text, i)


def content_spans(text: str, chat: Chat) -> list[tuple[int, int]]:
    """Where each message's content sits in the template's output, in order (a template may
    add text around a message, and trim its ends, never change its inside); a content the
    template changed more is skipped."""
    spans, at = [], 0
    for m in chat.messages:
        content = m.content if m.content in text[at:] else m.content.strip()
        if not content:
            continue
        start = text.find(content, at)
        if start < 0:
            continue
        spans.append((start, start + len(content)))
        at = start + len(content)
    return spans


def template_flags(spans: Sequence[tuple[int, int]], content: Sequence[tuple[int, int]]
                   ) -> tuple[bool, ...]:
    """Per token: True when no character of it belongs to a message's content."""
    return tuple(not any(a < ce and b > cs for cs, ce in content) for a, b in spans)


def overlapping(spans: Sequence[tuple[int, int]], start: int, end: int) -> list[int]:
    """The tokens whose characters overlap [start, end) (a token with an empty span, such as an
    added begin-of-text token, overlaps nothing)."""
    return [k for k, (a, b) in enumerate(spans) if a < end and b > start]


MAX_IDS = 1_000_000  # beyond any context window fptrace can trace (as MAX_PROMPT_CHARS)
_ASCII_IDS = re.compile(r"[0-9,\s]*")
IDS_HINT = "token ids are whole numbers from 0, e.g. --ids 504,3575,282"


def check_ids(values: Any, where: str) -> tuple[int, ...]:
    """Token ids from a parsed JSON value (a list of integers), or BadInput naming `where`. The
    vocabulary size is checked once the tokenizer is known (LoadedModel.prepare)."""
    if not isinstance(values, list):
        raise BadInput(f"{where}: expected a JSON list of token ids, got "
                       f"{type(values).__name__}; {IDS_HINT}")
    if not values:
        raise BadInput(f"{where}: no token ids; {IDS_HINT}")
    if len(values) > MAX_IDS:
        raise BadInput(f"{where}: {len(values):,} token ids; fptrace reads at most {MAX_IDS:,}")
    for k, v in enumerate(values):
        if not isinstance(v, int) or isinstance(v, bool):
            raise BadInput(f"{where}: id {k + 1} is {json.dumps(v)[:40]}, not a whole number; "
                           f"{IDS_HINT}")
        if v < 0:
            raise BadInput(f"{where}: id {k + 1} is {v}; {IDS_HINT}")
    return tuple(values)


def parse_ids(text: str, where: str = "--ids") -> tuple[int, ...]:
    """Token ids typed as text: separated by commas, spaces or new lines, a JSON list's
    brackets allowed ('504,3575,282', '[504, 3575, 282]', one id a line); each read by
    numbers.parse_int (ASCII digits only)."""
    from fptrace.numbers import parse_int

    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    parts = [p for p in re.split(r"[,\s]+", body) if p]
    if not parts:
        raise BadInput(f"{where}: no token ids; {IDS_HINT}")
    if len(parts) > MAX_IDS:
        raise BadInput(f"{where}: {len(parts):,} token ids; fptrace reads at most {MAX_IDS:,}")
    if _ASCII_IDS.fullmatch(body):  # the common case, read at once: ASCII digits only
        return tuple(int(p) for p in parts)
    return tuple(parse_int(p, f"{where}: token id", low=0) for p in parts)


def read_ids(path: str) -> tuple[int, ...]:
    """The token ids in a file (`--ids-file FILE`): a JSON list, or one id a line."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"no such file: {path}" if not p.exists() else
                       f"{param('ids_file')} {path} is not a file")
    if p.stat().st_size > 64 * MAX_IDS:
        raise BadInput(f"{param('ids_file')} {path}: {p.stat().st_size:,} bytes is more than "
                       f"{MAX_IDS:,} token ids could need")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise BadInput(f"{param('ids_file')} {path}: not UTF-8 text (byte {e.start})") from None
    if text.lstrip().startswith(("[", "{")):
        try:
            data = loads(text)
        except json.JSONDecodeError as e:
            raise BadInput(f"{param('ids_file')} {path}, line {e.lineno}: not JSON "
                           f"({e.msg})") from None
        return check_ids(data, f"--ids-file {path}")
    return parse_ids(text, f"--ids-file {path}")
