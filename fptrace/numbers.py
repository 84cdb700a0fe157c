"""Numbers typed by a user, read in one place.

Python's `int()` and `str.isdigit()` accept far more than a user means: `"²".isdigit()` is True
and `int("²")` raises, `int("٣")` is 3, `float("nan")` and `float("1e309")` (inf) are floats.
Every number fptrace reads from text (an option, a key in a file, a tensor name) goes through
these two functions, so a hostile value is refused the same way everywhere: one BadInput that
names the value and what it is.
"""

from __future__ import annotations

import math
import re

from fptrace.errors import BadInput

_INT = re.compile(r"[+-]?[0-9]+")
# digits of any script, superscripts included ('²', '٣', '１'): text a user meant as a number,
# which parse_int then refuses by name unless its digits are ASCII
DIGITS = re.compile(r"[+-]?[\d\u00b2\u00b3\u00b9\u2070-\u2079]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def is_int(text: str) -> bool:
    """Whether text is an integer written in ASCII digits (an optional sign, no spaces inside)."""
    return _INT.fullmatch(text.strip()) is not None


def parse_int(text: str, what: str, *, low: int | None = None, high: int | None = None) -> int:
    """An integer in ASCII digits, within [low, high] where given; `what` names the value in the
    error ("--layer", "block", "the tensor name 'direction.²'")."""
    s = text.strip()
    if _INT.fullmatch(s) is None:
        raise BadInput(f"{what} {text!r}: not a whole number (ASCII digits 0-9)")
    value = int(s)
    _check_range(value, what, low, high)
    return value


def parse_float(text: str, what: str, *, low: float | None = None,
                high: float | None = None) -> float:
    """A finite number in ASCII (no NaN, no infinity, no value that overflows a double)."""
    s = text.strip()
    if _FLOAT.fullmatch(s) is None:
        raise BadInput(f"{what} {text!r}: not a number")
    value = float(s)
    return check_finite(value, what, low=low, high=high)


def check_finite(value: float, what: str, *, low: float | None = None,
                 high: float | None = None) -> float:
    """A number that is finite and within [low, high] where given (Typer hands floats over
    already parsed: 'nan' and '1e309' arrive here as floats)."""
    if not math.isfinite(value):
        raise BadInput(f"{what} {value}: must be a finite number")
    _check_range(value, what, low, high)
    return value


def _check_range(value: float, what: str, low: float | None, high: float | None) -> None:
    if low is not None and value < low:
        raise BadInput(f"{what} {value}: must be at least {low}")
    if high is not None and value > high:
        raise BadInput(f"{what} {value}: must be at most {high}")
