"""Examples of `fptrace ablate`: its golden view, its bad inputs, its notes' cases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fptrace.addresses import Head
from fptrace.examples import Bench, Case, NoteCase, Setup, View

PROMPT = "The cat sat on the mat"


def _ablated(lm: Any, **kw: Any) -> tuple[str, ...]:
    from fptrace.commands.ablate.core import ablate

    kw.setdefault("heads", [Head(1, 0)])
    return ablate(lm, [5, 6, 7], **kw).notes


def _softcap(bench: Bench) -> tuple[Any, Any]:
    return _ablated(bench.lm("llama")), _ablated(bench.lm("gemma2"))


def _wo_bias(bench: Bench) -> tuple[Any, Any]:
    """GPT-2's c_proj has a bias: removing only an MLP leaves no head's block behind."""
    gpt2 = bench.lm("gpt2")
    return _ablated(gpt2, heads=(), mlps=[1]), _ablated(gpt2)


def _mean(bench: Bench) -> tuple[Any, Any]:
    return _ablated(bench.lm("llama")), _ablated(bench.lm("llama"), mode="mean")


NOTE_CASES = (NoteCase("ablate_softcap", _softcap),
              NoteCase("ablate_wo_bias", _wo_bias),
              NoteCase("ablate_mean", _mean))


def _view(lm: Any, bench: Bench) -> Callable[[Any], Any]:
    from fptrace.commands.ablate.core import ablate
    from fptrace.commands.ablate.render import ablate_view

    r = ablate(lm, PROMPT, heads=[Head(1, 1)], mlps=[0], all_heads=True, all_mlps=True, top=4)
    return lambda w: ablate_view(r, w)


VIEWS = (View("ablate", _view),)


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace ablate` (rows of docs/bad-inputs.md; the files they read are
    made by scripts/bad_inputs.py)."""
    m = at.model
    return (
        Case(63, "ablate: a head out of range", ("ablate", "hi", *m, "--head", "1.9")),
        Case(64, "ablate: nothing to remove", ("ablate", "hi", *m)),
        Case(89, "ablate: a head in Unicode digits", ("ablate", "hi", *m, "--head", "1.\u00b2")),
    )
