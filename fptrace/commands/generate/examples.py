"""Examples of `fptrace generate`: its golden view, its bad inputs, its notes' cases."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from fptrace.examples import Bench, Case, NoteCase, Render, Said, Setup, View

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

PROMPT = "The cat sat on the mat"


def _tensor_parallel(bench: Bench) -> Said:
    from fptrace.commands.generate.core import generate

    return generate(bench.lm("llama"), [5, 6, 7], max_new_tokens=1).notes, None


NOTE_CASES = (NoteCase("generate_tensor_parallel", _tensor_parallel),)


def _view(lm: LoadedModel, bench: Bench) -> Render:
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


VIEWS = (View("generate", _view),)


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace generate` (rows of docs/bad-inputs.md; the files they read are
    made by scripts/bad_inputs.py)."""
    m = at.model
    return (
        Case(1, "-n 0", ("generate", "hi", *m, "-n", "0")),
        Case(2, "-n beyond the context", ("generate", "hi", *m, "-n", "100")),
        Case(3, "--ids with --chat", ("generate", "--ids", "5,6", "--chat", *m)),
    )
