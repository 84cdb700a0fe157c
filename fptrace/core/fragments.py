"""Pieces of text a command takes beside the prompt: a target token (`--target ' Paris'`,
`--versus`, or `#ID`) and a subject inside the prompt (`--noise ' France'`).

A fragment is not tokenized the way a whole prompt is. A target is one token of the
vocabulary, encoded without the begin-of-text (or other) tokens a tokenizer adds to a whole
prompt; where that gives more than one token (Llama-2's SentencePiece writes ' Paris' alone as
'▁' + '▁Paris'), the token the text gets right after the prompt is taken, if it is one. A subject
is found by its characters, not its ids: the tokens of the prompt whose character spans overlap
the subject's span (a fragment's ids are not in general the ids it gets inside a prompt: the
leading '▁', merges across the boundary).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fptrace.errors import BadInput, param
from fptrace.numbers import DIGITS, is_int, parse_int

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel
    from fptrace.models.prompts import Prompt


def _shown(lm: LoadedModel, ids: Sequence[int]) -> str:
    return " + ".join(repr(lm.token_text(i)) for i in ids)


def token_id(lm: LoadedModel, text: str, what: str, prompt: Prompt | None = None) -> int:
    """The id of a token given as text (one token, as the tokenizer writes that text alone or
    right after `prompt`), or as `#ID`."""
    if text.startswith("#") and (is_int(text[1:]) or DIGITS.fullmatch(text[1:])):
        i = parse_int(text[1:], f"{what} {text!r}: the token id")  # '#²' is refused here
        if not 0 <= i < int(lm.config.vocab_size):
            raise BadInput(f"{what} {text}: outside the vocabulary (0..{lm.config.vocab_size - 1})")
        return i
    if not text:
        raise BadInput(f"{what} is empty: give a token's text (e.g. ' Paris') or #ID")
    if lm.tokenizer is None:
        raise BadInput(f"{what} {text!r}: {lm.name} has no tokenizer here; give the token as #ID")
    alone = lm.tokenizer.encode(text, special=False)
    if len(alone) == 1:
        return alone[0]
    if prompt is not None:
        after = _after_prompt(lm, prompt, text)
        if after is not None and len(after) == 1:
            return after[0]
    if not alone:
        raise BadInput(f"{what} {text!r} gives no token")
    raise BadInput(f"{what} {text!r} is {len(alone)} tokens ({_shown(lm, alone)}), not one; "
                   f"give one token (mind the leading space, e.g. ' Paris'), or its id as #ID "
                   f"(#{alone[0]} is {lm.token_text(alone[0])!r})")


def _after_prompt(lm: LoadedModel, prompt: Prompt, text: str) -> list[int] | None:
    """The ids `text` gets when it follows the prompt, if the prompt's own ids stay a prefix."""
    p = lm.prepare(prompt)
    if p.from_ids or p.dropped or lm.tokenizer is None:  # text was prepared: it has one
        return None
    special = not p.chat
    ids = lm.tokenizer.encode(p.text + text, special)
    n = len(p.ids)
    return ids[n:] if ids[:n] == list(p.ids) else None


def subject_positions(lm: LoadedModel, prompt: Prompt, subject: str, occurrence: int | None = None,
                      what: str = "--noise") -> list[int]:
    """The positions of the prompt's tokens whose characters overlap the subject's; with
    several occurrences of the subject, `occurrence` (from 1) chooses one."""
    p = lm.prepare(prompt)
    if not subject.strip():
        raise BadInput(f"{what} is empty: give the subject's text as it is in the prompt")
    starts, at = [], p.text.find(subject)
    while at >= 0:
        starts.append(at)
        at = p.text.find(subject, at + 1)
    toks = " ".join(repr(lm.token_text(i)) for i in p.ids)
    if not starts:
        raise BadInput(f"{what} {subject!r} is not in the prompt ({p.text!r}; its tokens: "
                       f"{toks}); give the subject's characters as they are in the prompt")
    spans = lm.spans(p)
    if spans is None:
        raise BadInput(f"{what} {subject!r}: the tokenizer of {lm.name} gives no character "
                       "positions for this prompt, so its tokens cannot be located"
                       + (" (the prompt was given as token ids)" if p.from_ids else ""))
    found = [[k for k, (a, b) in enumerate(spans) if a < s + len(subject) and b > s]
             for s in starts]
    if occurrence is not None:
        if not 1 <= occurrence <= len(starts):
            raise BadInput(f"{what}-occurrence {occurrence}: {subject!r} occurs "
                           f"{len(starts)} time{'s' if len(starts) > 1 else ''} in the prompt")
        chosen = found[occurrence - 1]
    elif len(starts) > 1:
        where = "; ".join(f"{n + 1}: positions {', '.join(map(str, f))} "
                          f"({_shown(lm, [p.ids[k] for k in f])})" for n, f in enumerate(found))
        raise BadInput(f"{what} {subject!r} occurs {len(starts)} times in the prompt ({where}); "
                       f"choose one with {what}-occurrence N")
    else:
        chosen = found[0]
    if not chosen:
        raise BadInput(f"{what} {subject!r}: no token of the prompt covers it (dropped by "
                       f"{param('truncate')}?)")
    return chosen
