"""Examples of `fptrace serve`: its bad inputs (it has no table to keep golden)."""

from __future__ import annotations

from fptrace.examples import Case, Setup


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace serve` (rows of docs/bad-inputs.md)."""
    return (
        Case(1, "serve: a memory budget in non-ASCII digits", ("serve", "--memory-budget",
                                                                "²GiB")),
        Case(2, "serve: a negative idle timeout", ("serve", "--idle-timeout", "-5")),
        Case(3, "serve: --stop and --status together", ("serve", "--stop", "--status")),
        Case(4, "serve: a memory budget of nothing", ("serve", "--memory-budget", "0")),
        Case(5, "serve: a memory budget of a fraction of a byte", ("serve", "--memory-budget",
                                                                     "0.4B")),
        Case(6, "serve: an idle timeout past any clock", ("serve", "--idle-timeout",
                                                           "99999999999999999999")),
    )
