"""Golden files of the rendered output of run, explain, shapes and generate, at 80, 120 and
200 columns, on a seeded tiny GPT-2 (the real GPT-2 tokenizer, random weights) and on the
gpt2 config (shapes, meta device): a layout change shows as a reviewed diff.

Regenerate after an intended change (then read `git diff tests/golden/`):

    python tests/golden.py

tests/test_golden.py renders the same views and compares them with these files.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
from pathlib import Path

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
WIDTHS = (80, 120, 200)
PROMPT = "The cat sat on the mat"


def _console(width: int):
    from rich.console import Console

    return Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False,
                   highlight=False)


def _model():
    sys.path.insert(0, str(HERE))
    from conftest import tiny_gpt2

    from fptrace.models.loading import load_model

    return load_model(tiny_gpt2(), random_weights=True, seed=0, device="cpu")


def views() -> dict[str, object]:
    """name -> a function of the width that returns the renderable."""
    from fptrace.generate import generate
    from fptrace.render.explain import explain_view
    from fptrace.render.generate import step_columns, step_header, step_line, summary
    from fptrace.render.shapes import shape_view
    from fptrace.render.tables import trace_view
    from fptrace.shapes import shape_report
    from fptrace.tracer import run_trace
    from fptrace.walkthrough import explain

    lm = _model()
    trace = run_trace(lm, PROMPT, top_k=5)
    explanation = explain(lm, PROMPT, layer=1, head=1)
    report = dataclasses.replace(shape_report("gpt2", seq_len=6), seconds=0.0)  # no timing
    gen = generate(lm, PROMPT, max_new_tokens=3)
    gen = dataclasses.replace(  # timings masked: every step 1 ms
        gen, steps=tuple(dataclasses.replace(s, seconds=0.001) for s in gen.steps),
        prefill_seconds=0.001, decode_seconds=0.001 * (len(gen.steps) - 1),
        decode_tokens_per_s=1000.0)

    def generation(width: int | None):
        from rich.console import Group

        info = gen.model
        cols = step_columns(width, len(gen.tokens) + gen.max_new_tokens, info.d_model,
                            info.n_kv_heads, info.head_dim)
        text = ""
        lines = [step_header(cols)]
        for step, tok in zip(gen.steps, gen.generated):
            text += tok.text
            lines.append(step_line(step, text, cols))
        return Group(*lines, summary(gen))

    return {"run": lambda w: trace_view(trace, w), "explain": lambda w: explain_view(explanation, w),
            "shapes": lambda w: shape_view(report, w), "generate": generation}


def render(view, width: int) -> str:
    console = _console(width)
    console.print(view(width), soft_wrap=False)
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines()) + "\n"


def path(name: str, width: int) -> Path:
    return GOLDEN / f"{name}-{width}.txt"


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    GOLDEN.mkdir(exist_ok=True)
    for name, view in views().items():
        for width in WIDTHS:
            path(name, width).write_text(render(view, width), encoding="utf-8")
            print(f"wrote {path(name, width).relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
