"""The views the golden files hold: every command's terminal output, rendered at 80, 120 and
200 columns, on a seeded tiny GPT-2 (the real GPT-2 tokenizer, random weights) and on the gpt2
config (shapes, meta device): a layout change shows as a reviewed diff.

tests/test_golden.py renders each view and compares it with tests/golden/<view>-<width>.txt
through the `golden` fixture (conftest.py); `pytest tests/test_golden.py --update-golden`
rewrites them. A command's view is one entry of VIEWS.
"""

from __future__ import annotations

import dataclasses
import io
import sys
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).parent
WIDTHS = (80, 120, 200)
PROMPT = "The cat sat on the mat"


def _model():
    sys.path.insert(0, str(HERE))
    from conftest import tiny_gpt2

    from fptrace.models.loading import load_model

    return load_model(tiny_gpt2(), random_weights=True, seed=0, device="cpu")


def _run(lm: Any) -> Callable:
    from fptrace.commands.run.render import trace_view
    from fptrace.core.trace import run_trace

    trace = dataclasses.replace(run_trace(lm, PROMPT, top_k=5), tokenize_seconds=50e-6)
    return lambda w: trace_view(trace, w)  # the tokenizer's time masked: 50 µs


def _explain(lm: Any) -> Callable:
    from fptrace.commands.explain.core import explain
    from fptrace.commands.explain.render import explain_view

    e = explain(lm, PROMPT, layer=1, head=1)
    return lambda w: explain_view(e, w)


def _shapes(lm: Any) -> Callable:
    from fptrace.commands.shapes.core import shape_report
    from fptrace.commands.shapes.render import shape_view

    report = dataclasses.replace(shape_report("gpt2", seq_len=6), seconds=0.0)  # no timing
    return lambda w: shape_view(report, w)


def _generate(lm: Any) -> Callable:
    from rich.console import Group

    from fptrace.commands.generate.core import generate
    from fptrace.commands.generate.render import step_columns, step_header, step_line, summary

    gen = generate(lm, PROMPT, max_new_tokens=3)
    gen = dataclasses.replace(  # timings masked: every step 1 ms
        gen, steps=tuple(dataclasses.replace(s, seconds=0.001) for s in gen.steps),
        prefill_seconds=0.001, decode_seconds=0.001 * (len(gen.steps) - 1),
        decode_tokens_per_s=1000.0)

    def generation(width: int | None):
        info = gen.model
        cols = step_columns(width, len(gen.tokens) + gen.max_new_tokens, info.d_model,
                            info.n_kv_heads, info.head_dim)
        text = ""
        lines = [step_header(cols)]
        for step, tok in zip(gen.steps, gen.generated):
            text += tok.text
            lines.append(step_line(step, text, cols))
        return Group(*lines, summary(gen))

    return generation


def _attribute(lm: Any) -> Callable:
    from fptrace.commands.attribute.core import attribute
    from fptrace.commands.attribute.render import attribution_view

    a = attribute(lm, PROMPT, top=6)
    return lambda w: attribution_view(a, w)


def _attribute_qk(lm: Any) -> Callable:
    from rich.console import Group

    from fptrace.addresses import Head
    from fptrace.commands.attribute.qk import attribute_qk
    from fptrace.commands.attribute.render import qk_view

    a = attribute_qk(lm, PROMPT, Head(1, 1), top=6)
    b = attribute_qk(lm, PROMPT, Head(1, 0), key=2, top=4, group="source")
    return lambda w: Group(qk_view(a, w), qk_view(b, w))


def _diff(lm: Any) -> Callable:
    from fptrace.commands.diff.core import diff
    from fptrace.commands.diff.render import diff_view
    from fptrace.core.trace import run_trace

    d = diff(run_trace(lm, PROMPT), run_trace(lm, "The dog sat on the mat"))
    return lambda w: diff_view(d, w)


def _diff_deep(lm: Any) -> Callable:
    import torch

    from fptrace.commands.diff.deep import deep_diff
    from fptrace.commands.diff.render import diff_view

    b = _model()
    with torch.no_grad():  # one neuron of block 1's MLP reads its input twice as strongly
        b.model.transformer.h[1].mlp.c_fc.weight[:, 3] *= 2
    d = deep_diff(lm, b, PROMPT)
    return lambda w: diff_view(d, w)


def _patch(lm: Any) -> Callable:
    from fptrace.commands.patch.core import patch
    from fptrace.commands.patch.render import patch_view

    r = patch(lm, PROMPT, noise=" cat")
    return lambda w: patch_view(r, w)


def _steer(lm: Any) -> Callable:
    from fptrace.commands.steer.core import steer
    from fptrace.commands.steer.render import steer_view

    r = steer(lm, PROMPT, add=" love", subtract=" hate", layer=1, scales="0,1,2,4",
              new_tokens=3)
    return lambda w: steer_view(r, w)


def _ablate(lm: Any) -> Callable:
    from fptrace.addresses import Head
    from fptrace.commands.ablate.core import ablate
    from fptrace.commands.ablate.render import ablate_view

    r = ablate(lm, PROMPT, heads=[Head(1, 1)], mlps=[0], all_heads=True, all_mlps=True, top=4)
    return lambda w: ablate_view(r, w)


def _models(lm: Any) -> Callable:
    from fptrace.commands.models.core import list_models
    from fptrace.commands.models.render import models_table

    rows = list_models()
    return lambda w: models_table(rows, w)


def _stats(lm: Any) -> Callable:
    from fptrace.commands.stats.core import build, collect, new_statistics
    from fptrace.commands.stats.render import stats_view
    from fptrace.core.inputs import PromptItem
    from fptrace.core.trace import model_info

    items = [PromptItem(f"p:{i + 1}", p, f"p.txt:{i + 1}")
             for i, p in enumerate([PROMPT, "The dog ran", "A cat", "On the mat the cat sat"])]
    stats = new_statistics(lm)
    collect(lm, items, stats, batch_size=2)
    r = build(stats, model_info(lm), sink_threshold=0.2)
    return lambda w: stats_view(r, w)


VIEWS = {"run": _run, "explain": _explain, "shapes": _shapes, "generate": _generate,
         "attribute": _attribute, "attribute-qk": _attribute_qk, "diff": _diff,
         "diff-deep": _diff_deep, "patch": _patch, "models": _models, "steer": _steer,
         "ablate": _ablate, "stats": _stats}


def views() -> dict[str, Callable]:
    """name -> a function of the width that returns the renderable."""
    lm = _model()
    return {name: make(lm) for name, make in VIEWS.items()}


def render(view: Callable, width: int) -> str:
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False,
                      highlight=False)
    console.print(view(width), soft_wrap=False)
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines()) + "\n"
