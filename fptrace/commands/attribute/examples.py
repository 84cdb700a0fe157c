"""Examples of `fptrace attribute`: its golden views, its bad inputs, its notes' cases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fptrace.addresses import Head
from fptrace.examples import Bench, Case, NoteCase, Render, Said, Setup, View

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

PROMPT = "The cat sat on the mat"


def _softcap(bench: Bench) -> Said:
    from fptrace.commands.attribute.core import attribute

    return attribute(bench.lm("llama"), [5, 6, 7]).notes, \
        attribute(bench.lm("gemma2"), [5, 6, 7]).notes


def _qk(lm: LoadedModel, **kw: Any) -> tuple[str, ...]:
    from fptrace.commands.attribute.qk import attribute_qk

    return attribute_qk(lm, [5, 6, 7, 8], Head(1, 0), **kw).notes


def _qk_key_defaulted(bench: Bench) -> Said:
    lm = bench.lm("llama")
    return _qk(lm, key=1), _qk(lm)


def _qk_softcap(bench: Bench) -> Said:
    return _qk(bench.lm("llama"), key=1), _qk(bench.lm("gemma2"), key=1)


NOTE_CASES = (NoteCase("attribute_softcap", _softcap),
              NoteCase("attribute_qk_key_defaulted", _qk_key_defaulted),
              NoteCase("attribute_qk_softcap", _qk_softcap))


def _view(lm: LoadedModel, bench: Bench) -> Render:
    from fptrace.commands.attribute.core import attribute
    from fptrace.commands.attribute.render import attribution_view

    a = attribute(lm, PROMPT, top=6)
    return lambda w: attribution_view(a, w)


def _view_qk(lm: LoadedModel, bench: Bench) -> Render:
    from rich.console import Group

    from fptrace.commands.attribute.qk import attribute_qk
    from fptrace.commands.attribute.render import qk_view

    a = attribute_qk(lm, PROMPT, Head(1, 1), top=6)
    b = attribute_qk(lm, PROMPT, Head(1, 0), key=2, top=4, group="source")
    return lambda w: Group(qk_view(a, w), qk_view(b, w))


VIEWS = (View("attribute", _view), View("attribute-qk", _view_qk))


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace attribute` (rows of docs/bad-inputs.md; the files they read are
    made by scripts/bad_inputs.py)."""
    m = at.model
    return (
        Case(1, "--target of two tokens",
             ("attribute", "The cat sat", *m, "--target", " catsat")),
        Case(2, "attribute --qk: block out of range",
             ("attribute", "The cat sat", *m, "--qk", "5.0")),
        Case(3, "attribute --qk: head out of range",
             ("attribute", "The cat sat", *m, "--qk", "1.2")),
        Case(4, "attribute --qk: a key after the query",
             ("attribute", "The cat sat", *m, "--qk", "1.0", "--query", "1", "--key", "2")),
        Case(5, "attribute --qk with --versus",
             ("attribute", "The cat sat", *m, "--qk", "1.0", "--versus", " dog")),
    )
