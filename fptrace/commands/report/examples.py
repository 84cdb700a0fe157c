"""Examples of `fptrace report`: its bad inputs."""

from __future__ import annotations

from fptrace.examples import Case, Setup


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace report` (rows of docs/bad-inputs.md; the files they read are
    made by scripts/bad_inputs.py)."""
    m = at.model
    p = at.path
    return (
        Case(1, "report: not an .html path", ("report", "hi", *m, "--out", p("r.txt"))),
    )
