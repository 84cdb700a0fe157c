"""Examples of `fptrace heads`: its bad inputs and its notes' cases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fptrace.examples import Bench, Case, NoteCase, Said, Setup

if TYPE_CHECKING:
    from fptrace.commands.heads.result import Heads

PROMPTS = [[5, 6, 7, 6, 9, 10, 6], [11, 12, 13, 14, 12]]


def _heads(bench: Bench, family: str = "llama", **kw: Any) -> Heads:
    from fptrace.commands.heads.core import heads

    kw.setdefault("induction", 2)
    kw.setdefault("induction_length", 6)
    return heads(bench.lm(family), PROMPTS, **kw)


def _story(bench: Bench, **kw: Any) -> tuple[str, ...]:
    return _heads(bench, **kw).story


def _with(bench: Bench, threshold: float, **kw: Any) -> tuple[str, ...]:
    """The story with every threshold set to `threshold` (2: out of reach; -1: every head
    clears it)."""
    from fptrace.commands.heads import roles

    saved = dict(roles.THRESHOLDS)
    try:
        roles.THRESHOLDS.update(dict.fromkeys(roles.THRESHOLDS, threshold))
        return _story(bench, check=False, **kw)
    finally:
        roles.THRESHOLDS.update(saved)


def _role(bench: Bench) -> Said:
    return _with(bench, 2.0), _with(bench, -1.0)


def _none(bench: Bench) -> Said:
    return _with(bench, -1.0), _with(bench, 2.0)


def _pattern_only(bench: Bench) -> Said:
    return _story(bench, check=False), None


def _claim(bench: Bench) -> Said:
    return _with(bench, 2.0), _with(bench, -1.0)


def _untested(bench: Bench) -> Said:
    return _with(bench, -1.0), _with(bench, 2.0)


def _no_ov(bench: Bench) -> Said:
    return _heads(bench, check=False).notes, None


def _unchecked(bench: Bench) -> Said:
    return _story(bench), _story(bench, check=False)


NOTE_CASES = (NoteCase("heads_role", _role),
              NoteCase("heads_role_none", _none),
              NoteCase("heads_pattern_only", _pattern_only),
              NoteCase("heads_claim", _claim),
              NoteCase("heads_claim_untested", _untested),
              NoteCase("heads_no_ov", _no_ov),
              NoteCase("heads_unchecked", _unchecked))


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace heads` (rows of docs/bad-inputs.md)."""
    m = at.model
    return (
        Case(1, "heads: prompts of one token (no previous-token pair)", ("heads", "A", *m)),
        Case(2, "heads: no repeated token and no induction sequences",
             ("heads", "The cat sat", "--induction", "0", *m)),
        Case(3, "heads: induction sequences longer than the context",
             ("heads", "The cat sat", "--induction", "2x100000", *m)),
        Case(4, "heads: a seed that is not a number", ("heads", "The cat sat", "--seed", "x",
                                                         *m)),
        Case(5, "heads: --induction not NxLEN", ("heads", "hi", "--induction", "8by64", *m)),
        Case(6, "heads: more OV tokens than the vocabulary",
             ("heads", "The cat sat on the cat", "--induction", "2x8", "--ov-tokens",
              "9999999", *m)),
        Case(7, "heads: more induction sequences than the memory holds (refused before they "
                "are drawn)", ("heads", "The cat sat", "--induction", "1000000000000x8", *m)),
    )
