"""Examples of `fptrace steer`: its golden view, its bad inputs, its notes' cases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fptrace.examples import Bench, Case, NoteCase, Render, Said, Setup, View

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

PROMPT = "The cat sat on the mat"


def _steered(lm: LoadedModel, **kw: Any) -> tuple[str, ...]:
    from fptrace.commands.steer.core import steer

    kw.setdefault("token", "#5")
    kw.setdefault("layer", 1)
    return steer(lm, [5, 6, 7], scales="0,1", **kw).notes


def _gguf_blocks(bench: Bench) -> Said:
    from fptrace.commands.steer.vectors import token_vector, write_vector

    lm = bench.lm("llama")
    path = str(bench.tmp("vector") / "v.gguf")
    write_vector(path, token_vector(lm, "#5", 1), lm)
    return _steered(lm), _steered(lm, token=None, layer=None, vector=path)


def _positions(bench: Bench) -> Said:
    return _steered(bench.lm("llama")), _steered(bench.lm("llama"), positions=[-1])


def _block0(bench: Bench) -> Said:
    return _steered(bench.lm("llama")), _steered(bench.lm("llama"), layer=0)


NOTE_CASES = (NoteCase("steer_gguf_blocks", _gguf_blocks),
              NoteCase("steer_positions", _positions),
              NoteCase("steer_block0", _block0))


def _view(lm: LoadedModel, bench: Bench) -> Render:
    from fptrace.commands.steer.core import steer
    from fptrace.commands.steer.render import steer_view

    r = steer(lm, PROMPT, add=" love", subtract=" hate", layer=1, scales="0,1,2,4",
              new_tokens=3)
    return lambda w: steer_view(r, w)


VIEWS = (View("steer", _view),)


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace steer` (rows of docs/bad-inputs.md; the files they read are
    made by scripts/bad_inputs.py)."""
    m = at.model
    p = at.path
    return (
        Case(1, "steer: a vector of another width",
             ("steer", "hi", *m, "--vector", p("wide.npy"), "--layer", "1")),
        Case(2, "steer: a GGUF that is not a control vector",
             ("steer", "hi", *m, "--vector", p("model.gguf"))),
        Case(3, "steer: --layer out of range",
             ("steer", "hi", *m, "--token", " cat", "--layer", "5")),
        Case(4, "steer: a strength that is not a number",
             ("steer", "hi", *m, "--token", " cat", "--layer", "1", "--scale", "0,two")),
        Case(5, "steer: --add without --subtract",
             ("steer", "hi", *m, "--add", " love", "--layer", "1")),
        Case(6, "steer: a token id in Unicode digits",
             ("steer", "hi", *m, "--token", "#\u00b2", "--layer", "1")),
        Case(7, "steer: a control vector's tensor named direction.\u00b2",
             ("steer", "hi", *m, "--vector", p("sup.safetensors"))),
        Case(8, "steer: a control vector holding NaN",
             ("steer", "hi", *m, "--vector", p("nan.safetensors"))),
        Case(9, "steer: a .npy of strings",
             ("steer", "hi", *m, "--vector", p("strings.npy"), "--layer", "1")),
        Case(10, "steer: a complex .npy",
             ("steer", "hi", *m, "--vector", p("complex.npy"), "--layer", "1")),
        Case(11, "steer: a strength that overflows",
             ("steer", "hi", *m, "--token", " cat", "--layer", "1", "--scale", "0,1e30")),
        Case(12, "steer: --add is empty",
             ("steer", "hi", *m, "--add", "", "--subtract", "x", "--layer", "1")),
        Case(13, "steer: a --pairs line longer than the context",
             ("steer", "hi", *m, "--pairs", p("long-pairs.jsonl"), "--layer", "1")),
        Case(14, "steer: --save-vector onto someone else's file",
             ("steer", "hi", *m, "--token", " cat", "--layer", "1", "--save-vector",
              p("mynotes.npy"))),
        Case(15, "steer --pairs: 100,000 nested lists",
             ("steer", "hi", *m, "--pairs", p("deep-pairs.jsonl"), "--layer", "1")),
        Case(16, "steer: --positions in Unicode digits",
             ("steer", "hi", *m, "--token", " cat", "--layer", "1", "--positions", "\u00b2")),
    )
