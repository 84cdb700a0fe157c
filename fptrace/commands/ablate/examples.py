"""Examples of `fptrace ablate`: its golden view, its bad inputs, its notes' cases."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fptrace.addresses import Head
from fptrace.examples import Bench, Case, NoteCase, Render, Said, Setup, View

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

PROMPT = "The cat sat on the mat"


def _ablated(lm: LoadedModel, **kw: Any) -> tuple[str, ...]:
    from fptrace.commands.ablate.core import ablate

    kw.setdefault("heads", [Head(1, 0)])
    return ablate(lm, [5, 6, 7], **kw).notes


def _softcap(bench: Bench) -> Said:
    return _ablated(bench.lm("llama")), _ablated(bench.lm("gemma2"))


def _wo_bias(bench: Bench) -> Said:
    """GPT-2's c_proj has a bias: removing only an MLP leaves no head's block behind."""
    gpt2 = bench.lm("gpt2")
    return _ablated(gpt2, heads=(), mlps=[1]), _ablated(gpt2)


def _mean(bench: Bench) -> Said:
    return _ablated(bench.lm("llama")), _ablated(bench.lm("llama"), mode="mean")


def _expert(family: str, route: str = "renormalise", expert: int | None = None
            ) -> Callable[[Bench], Said]:
    """Removing an MLP of the same model: no expert note; removing expert 0 of its last block
    (or `expert`, default the one the last position chose first) with `route`: the note."""
    def run(bench: Bench) -> Said:
        from fptrace.addresses import Expert
        from fptrace.core.trace import run_trace

        lm = bench.lm(family)
        ids = [5, 6, 7]
        routing = run_trace(lm, ids).routing
        assert routing is not None
        last = routing.blocks[-1]
        e = last.experts[-1][0] if expert is None else expert
        if expert is not None and e in last.experts[-1]:  # an expert the last position skipped
            e = next(i for i in range(lm.config.num_experts) if i not in last.experts[-1])
        return (_ablated(lm, heads=(), mlps=[last.layer]),
                _ablated(lm, heads=(), experts=[Expert(last.layer, e)], route=route))
    return run


def _every_chosen(family: str) -> Callable[[Bench], Said]:
    """One expert the last position chose removed at its last block: the others stay; every
    one it chose removed: none is left."""
    def run(bench: Bench) -> Said:
        from fptrace.addresses import Expert
        from fptrace.core.trace import run_trace

        lm = bench.lm(family)
        routing = run_trace(lm, [5, 6, 7]).routing
        assert routing is not None
        last = routing.blocks[-1]
        chosen = [Expert(last.layer, e) for e in last.experts[-1]]
        return (_ablated(lm, heads=(), experts=chosen[:1]),
                _ablated(lm, heads=(), experts=chosen))
    return run


NOTE_CASES = (NoteCase("ablate_softcap", _softcap),
              NoteCase("ablate_wo_bias", _wo_bias),
              NoteCase("ablate_mean", _mean),
              NoteCase("ablate_expert_renormalise", _expert("mixtral")),
              NoteCase("ablate_expert_kept", _expert("olmoe")),
              NoteCase("ablate_expert_next", _expert("olmoe", "next")),
              NoteCase("ablate_expert_unchosen", _expert("olmoe", expert=0)),
              NoteCase("ablate_expert_none_left", _every_chosen("mixtral")))


def _view(lm: LoadedModel, bench: Bench) -> Render:
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
        Case(1, "ablate: a head out of range", ("ablate", "hi", *m, "--head", "1.9")),
        Case(2, "ablate: nothing to remove", ("ablate", "hi", *m)),
        Case(3, "ablate: a head in Unicode digits", ("ablate", "hi", *m, "--head", "1.\u00b2")),
        Case(4, "ablate: an expert of a dense model", ("ablate", "hi", *m, "--expert", "1.0")),
        Case(5, "ablate: -0 as the block (neither the first nor counted from the end)",
             ("ablate", "hi", *m, "--head", "-0.1")),
    )
