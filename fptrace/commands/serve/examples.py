"""Examples of `fptrace serve`: its bad inputs (it has no table to keep golden)."""

from __future__ import annotations

from fptrace.examples import Case, Setup


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace serve` (rows of docs/bad-inputs.md)."""
    return (
        Case(93, "serve: a memory budget in non-ASCII digits", ("serve", "--memory-budget",
                                                                "²GiB")),
        Case(94, "serve: a negative idle timeout", ("serve", "--idle-timeout", "-5")),
        Case(95, "serve: --stop and --status together", ("serve", "--stop", "--status")),
        Case(100, "serve: a memory budget of nothing", ("serve", "--memory-budget", "0")),
        Case(101, "serve: a memory budget of a fraction of a byte", ("serve", "--memory-budget",
                                                                     "0.4B")),
        Case(102, "serve: an idle timeout past any clock", ("serve", "--idle-timeout",
                                                           "99999999999999999999")),
    )
