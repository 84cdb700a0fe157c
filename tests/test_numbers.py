"""The one reader of numbers typed as text: ASCII digits only, finite values only."""

from __future__ import annotations

import pytest

from fptrace.errors import BadInput
from fptrace.numbers import check_finite, is_int, parse_float, parse_int


@pytest.mark.parametrize("text,value", [("0", 0), ("23", 23), ("-1", -1), (" +7 ", 7)])
def test_parse_int_reads_ascii_integers(text, value):
    assert parse_int(text, "--layer") == value
    assert is_int(text)


@pytest.mark.parametrize("text", ["²", "1²", "٣", "１", "", "-", "1.0", "1 2", "0x1", "1_000"])
def test_parse_int_refuses_what_int_or_isdigit_would_take(text):
    assert not is_int(text)
    with pytest.raises(BadInput, match="--layer"):
        parse_int(text, "--layer")


def test_parse_int_range_names_the_value():
    with pytest.raises(BadInput, match="at most 3"):
        parse_int("4", "block", high=3)
    with pytest.raises(BadInput, match="at least 0"):
        parse_int("-1", "block", low=0)


@pytest.mark.parametrize("text,value", [("1", 1.0), ("-0.5", -0.5), (".5", 0.5), ("1e3", 1000.0)])
def test_parse_float(text, value):
    assert parse_float(text, "--scale") == value


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e309", "²", "1,5", "infinity", ""])
def test_parse_float_refuses_non_finite_and_non_ascii(text):
    with pytest.raises(BadInput, match="--scale"):
        parse_float(text, "--scale")


def test_check_finite():
    assert check_finite(2.0, "--tolerance", low=0) == 2.0
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(BadInput, match="--tolerance"):
            check_finite(bad, "--tolerance", low=0)
