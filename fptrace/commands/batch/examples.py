"""Examples of `fptrace batch`: its bad inputs."""

from __future__ import annotations

from fptrace.examples import Case, Setup


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace batch` (rows of docs/bad-inputs.md; the files they read are
    made by scripts/bad_inputs.py)."""
    m = at.model
    p = at.path
    return (
        Case(1, "batch: missing input file", ("batch", p("none.txt"), "-o", p("o.jsonl"), *m)),
        Case(2, "batch: empty input", ("batch", p("empty.txt"), "-o", p("o.jsonl"), *m)),
        Case(3, "batch: --out is a folder", ("batch", p("prompts.txt"), "-o", at.tmp, *m)),
        Case(4, "batch: --out is someone else's file",
             ("batch", p("prompts.txt"), "-o", p("notes.txt"), *m)),
        Case(5, "batch: malformed .jsonl line",
             ("batch", p("bad.jsonl"), "-o", p("b.jsonl"), *m)),
        Case(6, "batch: invalid UTF-8", ("batch", p("latin1.txt"), "-o", p("c.jsonl"), *m)),
    )
