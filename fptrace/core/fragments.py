"""Pieces of text a command takes beside the prompt: a target token (`--target ' Paris'` or
`#ID`) and a subject inside the prompt (`--noise ' France'`)."""

from __future__ import annotations

from typing import Sequence

from fptrace.errors import BadInput
from fptrace.models.loading import LoadedModel


def token_id(lm: LoadedModel, text: str, what: str) -> int:
    """The id of a token given as text (exactly one token), or as `#ID`."""
    if text.startswith("#") and text[1:].isdigit():
        i = int(text[1:])
        if not 0 <= i < int(lm.config.vocab_size):
            raise BadInput(f"{what} {text}: outside the vocabulary (0..{lm.config.vocab_size - 1})")
        return i
    ids = lm.encode(text)
    if len(ids) != 1:
        shown = " + ".join(repr(lm.token_text(i)) for i in ids)
        raise BadInput(f"{what} {text!r} is {len(ids)} tokens ({shown}), not one; give one token "
                       "(mind the leading space, e.g. ' Paris'), or its id as #ID")
    return ids[0]


def subject_positions(lm: LoadedModel, ids: Sequence[int], subject: str) -> list[int]:
    """The positions of the subject's tokens in the prompt (its first occurrence)."""
    sub = lm.encode(subject)
    for start in range(len(ids) - len(sub) + 1):
        if list(ids[start:start + len(sub)]) == sub:
            return list(range(start, start + len(sub)))
    shown = " ".join(repr(lm.token_text(i)) for i in ids)
    raise BadInput(f"--noise {subject!r} ({' + '.join(repr(lm.token_text(i)) for i in sub)}) is "
                   f"not in the prompt's tokens ({shown}); mind the leading space")
