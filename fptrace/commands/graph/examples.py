"""Examples of `fptrace graph`: its bad inputs."""

from __future__ import annotations

from fptrace.examples import Case, Setup


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace graph` (rows of docs/bad-inputs.md)."""
    m = at.model
    g = ("graph", "The cat sat", *m, "--neurons")
    return (
        Case(260, "graph without --neurons", ("graph", "The cat sat", *m)),
        Case(261, "graph: --node-threshold above 1", (*g, "--node-threshold", "1.5")),
        Case(262, "graph: --edge-threshold NaN", (*g, "--edge-threshold", "nan")),
        Case(263, "graph: --edge-threshold negative", (*g, "--edge-threshold", "-0.1")),
        Case(264, "graph: --max-nodes 0", (*g, "--max-nodes", "0")),
        Case(265, "graph: --max-nodes not a whole number", (*g, "--max-nodes", "2.5")),
        Case(266, "graph: --positions outside the prompt", (*g, "--positions", "7")),
        Case(267, "graph: a prompt beyond the context",
             ("graph", "the cat " * 40, *m, "--neurons")),
        Case(268, "graph --neurons on a family whose MLP fptrace cannot freeze",
             ("graph", "--ids", "1,2,3", "--model", at.path("starcoder2"), "--neurons")),
        Case(269, "graph: --graph-json not a .json file",
             (*g, "--graph-json", at.path("notes.txt"))),
        Case(270, "graph: --graph-json over a file fptrace did not write",
             (*g, "--graph-json", at.path("robot.json"))),
    )
