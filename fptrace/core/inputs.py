"""The prompts of the commands that read many (batch, stats): .txt files (one prompt a line),
.jsonl files ({"id": ..., "prompt": ...} a line, {"id": ..., "messages": [...]} for the
model's chat template, or {"id": ..., "ids": [504, 3575, 282]} for token ids traced as they are;
other fields carried along), folders of them, or stdin.

Inputs are read whole before anything runs (prompt sets are small next to a forward pass), so
every input mistake is known up front: a missing file or a duplicate id stops the command before
it starts; a malformed line or bad UTF-8 becomes an item with an error, which the command
reports in its output while the rest still run. Ids are unique: they are how a run resumes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fptrace.errors import BadInput
from fptrace.jsontext import loads
from fptrace.userfiles import read_bytes

if TYPE_CHECKING:
    from fptrace.models.prompts import Chat

SUFFIXES = (".txt", ".jsonl")


@dataclass(frozen=True)
class PromptItem:
    id: str
    # the text, a Chat (a .jsonl line's "messages") or a tuple of token ids (its "ids"); None
    # when unreadable
    prompt: str | Chat | tuple[int, ...] | None
    source: str  # "file:line"
    extra: dict = field(default_factory=dict)  # fields of a .jsonl object beyond id and prompt
    error: str | None = None  # an input problem: the item becomes an error record

    def checked(self) -> str | Chat | tuple[int, ...]:
        """The prompt, refused (BadInput) where no tokenizer can take it."""
        from fptrace.models.prompts import Chat
        from fptrace.models.tokenizers import check_prompt

        if isinstance(self.prompt, tuple):  # token ids, read by check_ids
            return self.prompt
        if isinstance(self.prompt, Chat):
            for m in self.prompt.messages:
                if m.content:
                    check_prompt(m.content)
            return self.prompt
        return check_prompt(self.prompt or "")


def prompt_to_json(prompt: str | Chat | tuple[int, ...] | None) -> str:
    """A prompt (text, Chat or token ids) as JSON, to hand it to another process (a Ray
    worker)."""
    from fptrace.models.prompts import Chat

    if isinstance(prompt, tuple):
        return json.dumps({"ids": list(prompt)})
    return json.dumps({"messages": prompt.as_dicts()} if isinstance(prompt, Chat) else prompt)


def prompt_from_json(text: str) -> str | Chat | tuple[int, ...] | None:
    from fptrace.models.prompts import parse_messages

    value = loads(text)
    if isinstance(value, dict) and "ids" in value:
        return tuple(value["ids"])
    return parse_messages(value["messages"], "messages") if isinstance(value, dict) else value


def numbered_lines(data: bytes) -> Iterable[tuple[int, bytes]]:
    """(line number from 1, the line without its \\r\\n) of every line of data."""
    for n, raw in enumerate(data.split(b"\n"), start=1):
        yield n, raw.rstrip(b"\r")


def _parse(data: bytes, name: str, stem: str, as_jsonl: bool) -> list[PromptItem]:
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark: no part of the first prompt
        data = data[3:]
    items = []
    for n, raw in numbered_lines(data):
        where = f"{name}:{n}"
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            items.append(PromptItem(f"{stem}:{n}", None, where,
                                    error=f"{where}: not valid UTF-8 (byte {e.start})"))
            continue
        if not as_jsonl:
            items.append(PromptItem(f"{stem}:{n}", line, where))
            continue
        try:
            obj = loads(line)
        except json.JSONDecodeError as e:
            items.append(PromptItem(f"{stem}:{n}", None, where,
                                    error=f"{where}: malformed JSON ({e.msg}, column {e.colno})"))
            continue
        given = [k for k in ("prompt", "messages", "ids") if isinstance(obj, dict) and k in obj]
        if not isinstance(obj, dict) or len(given) != 1 or \
                (given == ["prompt"] and not isinstance(obj["prompt"], str)):
            items.append(PromptItem(f"{stem}:{n}", None, where, error=f'{where}: expected an '
                                    'object with a "prompt" string or a "messages" list, or an '
                                    '"ids" list of token ids (one of them)'))
            continue
        prompt: Any = obj.get("prompt")
        if given != ["prompt"]:  # token ids or chat messages, read and checked
            from fptrace.models.prompts import check_ids, parse_messages

            key = given[0]
            read = check_ids if key == "ids" else parse_messages
            try:
                prompt = read(obj[key], f'{where}: "{key}"')
            except BadInput as e:
                items.append(PromptItem(f"{stem}:{n}", None, where, error=str(e)))
                continue
        pid = obj.get("id", f"{stem}:{n}")
        if not isinstance(pid, (str, int)) or isinstance(pid, bool):
            items.append(PromptItem(f"{stem}:{n}", None, where,
                                    error=f'{where}: "id" must be a string or an integer'))
            continue
        extra = {k: v for k, v in obj.items() if k not in ("id", "prompt")}
        items.append(PromptItem(str(pid), prompt, where, extra))
    return items


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        if not found:
            raise BadInput(f"{path} holds no .txt or .jsonl files")
        return found
    if not path.exists():
        raise BadInput(f"no such input file: {path}")
    if path.suffix not in SUFFIXES:
        raise BadInput(f"{path}: inputs are .txt (one prompt per line), .jsonl "
                       '({"id": ..., "prompt": ...} per line), a folder of them, or - for stdin')
    return [path]


def read_inputs(inputs: Sequence[str], stdin: Any = None, exclude: str | None = None
                ) -> list[PromptItem]:
    """Every prompt of every input, in order. `-` reads stdin: JSON Lines when its first
    non-blank line starts with `{`, else one prompt per line. `exclude` (the output file) is
    skipped when a folder holds it."""
    skip = Path(exclude).resolve() if exclude and exclude != "-" else None
    if not inputs:
        raise BadInput("no inputs: give .txt or .jsonl files, a folder, or - for stdin")
    items: list[PromptItem] = []
    for spec in inputs:
        if spec == "-":
            data = (stdin or sys.stdin.buffer).read()
            first = next((raw.strip() for _, raw in numbered_lines(data) if raw.strip()), b"")
            items += _parse(data, "<stdin>", "stdin", first.startswith(b"{"))
            continue
        for f in _files(Path(spec)):
            if skip is not None and f.resolve() == skip:
                continue
            try:
                data = read_bytes(f)
            except OSError as e:
                raise BadInput(f"cannot read {f}: {e.strerror}") from e
            items += _parse(data, str(f), f.stem, f.suffix == ".jsonl")
    if not items:
        raise BadInput("the inputs hold no prompts (blank lines are skipped)")
    seen: dict[str, str] = {}
    for it in items:
        if it.id in seen:
            raise BadInput(f"duplicate id {it.id!r} at {it.source} (first at {seen[it.id]}); "
                           "ids must be unique, they are how a batch resumes")
        seen[it.id] = it.source
    return items


__all__ = [
    "SUFFIXES",
    "PromptItem",
    "numbered_lines",
    "prompt_from_json",
    "prompt_to_json",
    "read_inputs",
]
