"""Examples of `fptrace attribute`: its golden views, its bad inputs, its notes' cases."""

from __future__ import annotations

from typing import Any

from fptrace.examples import Bench, NoteCase


def _softcap(bench: Bench) -> tuple[Any, Any]:
    from fptrace.commands.attribute.core import attribute

    return attribute(bench.lm("llama"), [5, 6, 7]).notes, \
        attribute(bench.lm("gemma2"), [5, 6, 7]).notes


def _qk(lm: Any, **kw: Any) -> tuple[str, ...]:
    from fptrace.commands.attribute.qk import attribute_qk

    return attribute_qk(lm, [5, 6, 7, 8], 1, 0, **kw).notes


def _qk_key_defaulted(bench: Bench) -> tuple[Any, Any]:
    lm = bench.lm("llama")
    return _qk(lm, key=1), _qk(lm)


def _qk_softcap(bench: Bench) -> tuple[Any, Any]:
    return _qk(bench.lm("llama"), key=1), _qk(bench.lm("gemma2"), key=1)


NOTE_CASES = (NoteCase("attribute_softcap", _softcap),
              NoteCase("attribute_qk_key_defaulted", _qk_key_defaulted),
              NoteCase("attribute_qk_softcap", _qk_softcap))
