"""Examples of `fptrace diff`: its golden views, its bad inputs, its notes' cases."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from fptrace.examples import Bench, Case, NoteCase, Render, Said, Setup, View

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

PROMPT = "The cat sat on the mat"


def _traced(lm: LoadedModel, ids: list[int], **kw: Any) -> Any:
    from fptrace.core.trace import run_trace

    return run_trace(lm, ids, **kw)


def _diffed(a: Any, b: Any) -> tuple[str, ...]:
    from fptrace.commands.diff.core import diff

    return diff(a, b).notes


def _models(bench: Bench) -> Said:
    t = _traced(bench.lm("llama"), [5, 6, 7], snippet=64)
    return _diffed(t, t), _diffed(t, _traced(bench.lm("mistral"), [5, 6, 7], snippet=64))


def _random(bench: Bench) -> Said:
    t = _traced(bench.lm("llama", random_weights=False), [5, 6, 7], snippet=64)
    r = _traced(bench.lm("llama"), [5, 6, 7], snippet=64)
    return _diffed(t, t), _diffed(t, r)


def _blocks(bench: Bench) -> Said:
    t = _traced(bench.lm("llama"), [5, 6, 7], snippet=64)
    short = dataclasses.replace(t, layers=t.layers[:-1])
    return _diffed(t, t), _diffed(t, short)


def _widths(bench: Bench) -> Said:
    t = _traced(bench.lm("llama"), [5, 6, 7], snippet=64)
    return _diffed(t, t), None


def _snippet(bench: Bench) -> Said:
    lm = bench.lm("llama")
    return _diffed(_traced(lm, [5, 6, 7], snippet=64), _traced(lm, [5, 6, 8], snippet=64)), \
        _diffed(_traced(lm, [5, 6, 7]), _traced(lm, [5, 6, 8]))


def _nonfinite(bench: Bench) -> Said:
    lm = bench.lm("llama")
    t = _traced(lm, [5, 6, 7], snippet=64)
    rows = list(t.layers)
    for i in range(2, len(rows)):  # block 1 on: as a trace with NaN from there holds it
        rows[i] = dataclasses.replace(rows[i], snippet=(float("nan"),) * 64)
    bad = dataclasses.replace(t, layers=tuple(rows), first_nonfinite="block 1")
    return _diffed(t, t), _diffed(t, bad)


def _deep(bench: Bench, b: Any) -> tuple[str, ...]:
    import copy

    from fptrace.commands.diff.deep import deep_diff
    from fptrace.models.loading import wrap_model

    a = bench.lm("llama")
    other = b or wrap_model(copy.deepcopy(a.model), name="copy", random_weights=True)
    return deep_diff(a, other, [5, 6, 7]).deep.notes


def _deep_block_level(bench: Bench) -> Said:
    return _deep(bench, None), _deep(bench, bench.lm("gpt2"))


def _deep_missing_points(bench: Bench) -> Said:
    return _deep(bench, None), None


# diff_stats_prompts: its case writes two statistics files with another command, which this folder
# may not import; it stays in tests/test_notes.py
NOTE_CASES = (NoteCase("diff_models", _models), NoteCase("diff_random", _random),
              NoteCase("diff_blocks", _blocks), NoteCase("diff_widths", _widths),
              NoteCase("diff_snippet", _snippet), NoteCase("diff_nonfinite", _nonfinite),
              NoteCase("diff_deep_block_level", _deep_block_level),
              NoteCase("diff_deep_missing_points", _deep_missing_points))


def _view(lm: LoadedModel, bench: Bench) -> Render:
    from fptrace.commands.diff.core import diff
    from fptrace.commands.diff.render import diff_view
    from fptrace.core.trace import run_trace

    d = diff(run_trace(lm, PROMPT), run_trace(lm, "The dog sat on the mat"))
    return lambda w: diff_view(d, w)


def _view_deep(lm: LoadedModel, bench: Bench) -> Render:
    import torch

    from fptrace.commands.diff.deep import deep_diff
    from fptrace.commands.diff.render import diff_view
    from fptrace.models.loading import load_model

    b = load_model(bench.gpt2_folder(), random_weights=True, seed=0, device="cpu")  # lm again
    with torch.no_grad():  # one neuron of block 1's MLP reads its input twice as strongly
        b.model.transformer.h[1].mlp.c_fc.weight[:, 3] *= 2
    d = deep_diff(lm, b, PROMPT)
    return lambda w: diff_view(d, w)


VIEWS = (View("diff", _view), View("diff-deep", _view_deep))


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace diff` (rows of docs/bad-inputs.md; the files they read are
    made by scripts/bad_inputs.py)."""
    m = at.model
    p = at.path
    return (
        Case(1, "diff: a trace file that does not exist",
             ("diff", p("nope.json"), p("other.json"))),
        Case(2, "diff --deep: --deep-layers out of range",
             ("diff", "hi", *m, "--model-b", at.folder, "--deep", "--deep-layers", "2-5")),
        Case(3, "diff --deep with two prompts", ("diff", "hi", "ho", *m, "--deep")),
        Case(4, "diff: a quantization that does not exist",
             ("diff", "hi", *m, "--quantize-b", "int3")),
        Case(5, "diff: quantizing random weights",
             ("diff", "hi", *m, "--random-weights", "--quantize-b", "int8")),
        Case(6, "diff: a negative --tolerance",
             ("diff", "hi", *m, "--dtype-b", "float16", "--tolerance=-1")),
        Case(7, "diff: quantizing GPT-2's Conv1D layers",
             ("diff", "hi", *m, "--quantize-b", "int4")),
        Case(8, "diff --deep: a reversed --deep-layers range",
             ("diff", "hi", *m, "--model-b", at.folder, "--deep", "--deep-layers", "1-0")),
    )
