"""fptrace.addresses: one parser and one printer for a place in the model. Every value prints in
a form that parses back to it; every short form a user types means what docs/addresses.md says;
anything else (Unicode digits, stray dots, reversed ranges, huge numbers, empty text) is one
BadInput that names the value, never another exception; resolution against a model names its
sizes, counts negative indices from the end and never expands a range it has not checked."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fptrace.addresses import (
    ALL,
    Block,
    Expert,
    Head,
    Position,
    Selection,
    Site,
    Sizes,
    parse,
    parse_block,
    parse_expert,
    parse_head,
    parse_position,
    parse_selection,
    parse_site,
    resolve_block,
    resolve_expert,
    resolve_head,
    resolve_position,
    resolve_selection,
    resolve_site,
    site_name,
)
from fptrace.errors import BadInput
from fptrace.points import BLOCK, Point

N = st.integers(-(10**9) + 1, 10**9 - 1)  # what an address can hold: at most 9 digits
TINY = Sizes(model="tiny-gpt2", blocks=2, heads=2)
MOE = Sizes(model="tiny-moe", blocks=4, heads=8, experts=16)


# ---------------------------------------------------------------- the printer and the parser

@given(N)
def test_a_block_round_trips(i):
    b = Block(i)
    assert parse(str(b), "x") == b and parse_block(str(b), "x") == b


@given(N, N)
def test_a_head_round_trips(layer, head):
    h = Head(layer, head)
    assert parse(str(h), "x") == h and parse_head(str(h), "x") == h


@given(N, N)
def test_an_expert_round_trips(layer, expert):
    e = Expert(layer, expert)
    assert parse(str(e), "x") == e and parse_expert(str(e), "x") == e


@given(N, st.sampled_from(BLOCK))
def test_a_site_round_trips(layer, point):
    s = Site(layer, point)
    assert parse(str(s), "x") == s and parse_site(str(s), "x") == s


@given(N)
def test_a_position_round_trips(i):
    assert parse_position(str(Position(i)), "x") == Position(i)


def _item():
    pair = st.tuples(N, N).filter(lambda p: (p[0] < 0) != (p[1] < 0) or p[0] <= p[1])
    return st.one_of(N, pair)


@given(st.one_of(st.none(), st.lists(_item(), min_size=1, max_size=6).map(tuple)))
def test_a_selection_round_trips(items):
    s = Selection(items)
    assert parse_selection(str(s), "x") == s


def test_the_canonical_forms():
    assert str(Head(23, 4)) == "23.4" and str(Block(3)) == "3" and str(Block(-1)) == "-1"
    assert str(Expert(23, 4)) == "L23E4" and str(Position(-1)) == "-1"
    assert str(Site(23, Point.q)) == "blocks.23.attn.q"
    assert str(Site(0, Point.attn_weights)) == "blocks.0.attn.weights"
    assert str(Site(2, Point.mlp_act)) == "blocks.2.mlp.act"
    assert str(Site(5, Point.resid_post)) == "blocks.5.resid_post"
    assert str(Selection(((0, 3), 7))) == "0-3,7" and str(ALL) == "all"
    assert repr(Head(23, 4)) == "Head(23, 4)" and repr(Block(3)) == "Block(3)"


@pytest.mark.parametrize("text, value", [
    ("23.4", Head(23, 4)), ("L23H4", Head(23, 4)), ("l23h4", Head(23, 4)),
    ("-1.-1", Head(-1, -1)), ("L-1H-1", Head(-1, -1)), (" 23.4 ", Head(23, 4)),
    ("L23E4", Expert(23, 4)), ("l23e4", Expert(23, 4)),
    ("23", Block(23)), ("L23", Block(23)), ("-1", Block(-1)), ("007", Block(7)),
    ("blocks.23.attn.q", Site(23, Point.q)), ("blocks.23.hook_resid_post",
                                              Site(23, Point.resid_post)),
    ("blocks.3.attn.hook_q", Site(3, Point.q)), ("blocks.3.mlp.gate", Site(3, Point.mlp_gate)),
    ("blocks.-1.ln2", Site(-1, Point.ln2)),
])
def test_every_short_form(text, value):
    assert parse(text, "--x") == value


def test_an_expert_is_also_L_dot_E_where_an_expert_is_asked_for():
    assert parse_expert("23.4", "--expert") == Expert(23, 4)
    assert parse("23.4", "--x") == Head(23, 4)  # by its form alone, L.H is a head


@pytest.mark.parametrize("text, items", [
    ("0-3,7", ((0, 3), 7)), ("0,4,8-9", (0, 4, (8, 9))), ("-1", (-1,)), ("last", (-1,)),
    ("LAST", (-1,)), ("0--1", ((0, -1),)), ("-3--1", ((-3, -1),)), ("2-2", ((2, 2),)),
    ("0, 3, -1", (0, 3, -1)), ("all", None), ("ALL", None),
])
def test_selections(text, items):
    assert parse_selection(text, "--positions") == Selection(items)


def test_every_point_of_a_block_has_one_site_name():
    names = [site_name(p) for p in BLOCK]
    assert len(set(names)) == len(BLOCK)
    for p in BLOCK:
        assert parse_site(f"blocks.7.{site_name(p)}", "--site").point is p
        group, dot, last = site_name(p).rpartition(".")
        assert parse_site(f"blocks.7.{group}{dot}hook_{last}", "--site").point is p


# ---------------------------------------------------------------- strict

HOSTILE = ["²", "٣", "１", "-", "1.", ".1", "1.2.3", "99999999999999999999", "", "   ", "1 2",
           "+1", "23:4", "L", "LH", "1..2", "0x10", "1e3", "١.٢", "1.²", "²³"]


@pytest.mark.parametrize("kind", [parse_head, parse_expert])
@pytest.mark.parametrize("text", HOSTILE + ["1", "L23", "23", "L1H", "L1E", "H1", "1.-", "1.+2"])
def test_bad_pairs_are_refused_naming_the_value(kind, text):
    with pytest.raises(BadInput) as e:
        kind(text, "--head")
    assert str(e.value).startswith(f"--head {text!r}"), e.value


@pytest.mark.parametrize("text", HOSTILE + ["L1H2", "L1E2", "1-2", "blocks.1.q"])
def test_bad_blocks_are_refused_naming_the_value(text):
    with pytest.raises(BadInput) as e:
        parse_block(text, "--layer")
    assert str(e.value).startswith(f"--layer {text!r}"), e.value


@pytest.mark.parametrize("text", HOSTILE + ["1-0", "5-2", "-1--3", "0,,1", ",", "0,", "all,1",
                                            "0-", "-", "--1", "1-2-3", "0-1.5", "first"])
def test_bad_selections_are_refused_naming_the_value(text):
    with pytest.raises(BadInput) as e:
        parse_selection(text, "--positions")
    assert str(e.value).startswith(f"--positions {text!r}"), e.value


def test_a_reversed_range_says_which_way_round():
    with pytest.raises(BadInput, match=r"^--deep-layers '1-0': the range 1-0 is reversed; "
                       r"write 0-1$"):
        parse_selection("1-0", "--deep-layers")


@pytest.mark.parametrize("text, hint", [
    ("blocks.3.q", "did you mean blocks.3.attn.q?"),
    ("blocks.3.attn_weights", "did you mean blocks.3.attn.weights?"),
    ("blocks.3.mlp_act", "did you mean blocks.3.mlp.act?"),
    ("blocks.3.attn.resid_pre", "no point 'attn.resid_pre'"),
    ("blocks.3", "give a site as"), ("blocks.².attn.q", "the block '²'"),
    ("block.3.attn.q", "give a site as"), ("blocks.3.embed", "no point 'embed'"),
])
def test_bad_sites_say_what_is_meant(text, hint):
    with pytest.raises(BadInput, match="^--site " + repr(text).replace(".", r"\.")) as e:
        parse_site(text, "--site")
    assert hint in str(e.value)


@pytest.mark.parametrize("kind, text", [(parse_block, "-0"), (parse_block, "L-00"),
                                        (parse_head, "-0.1"), (parse_head, "1.-0"),
                                        (parse_expert, "L-0E2"), (parse_selection, "-0"),
                                        (parse_selection, "1--0")])
def test_minus_zero_is_no_place(kind, text):
    """-0 is neither the first (0) nor one counted from the end (-1 is the last): refused,
    not read as the first block, head or expert."""
    with pytest.raises(BadInput, match="ambiguous: 0 is the first, -1 the last"):
        kind(text, "--x")


def test_minus_zero_through_the_command_line(tmp_path):
    from conftest import make_gpt2_folder
    from typer.testing import CliRunner

    from fptrace.cli.main import app

    folder = str(make_gpt2_folder(tmp_path)[0])
    r = CliRunner().invoke(app, ["ablate", "The cat", "-m", folder, "--head", "-0.1"])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [
        "fptrace: error: --head '-0.1': the block '-0' is ambiguous: 0 is the first, -1 the "
        "last; give a block and a head as 23.4 or L23H4"]


def test_a_long_number_is_too_large_and_long_text_is_not_a_number():
    with pytest.raises(BadInput, match=r"^--layer '1234567890': the block '1234567890' is too "
                       r"large \(at most 9 digits\)$"):
        parse_block("1234567890", "--layer")
    assert parse_block("-999999999", "--layer") == Block(-999999999)
    with pytest.raises(BadInput, match=r"the block '²²²²²²²²²²²²': not a whole number"):
        parse_block("²" * 12, "--layer")


def test_unicode_digits_are_refused_and_the_message_names_them():
    for text in ("1.²", "L1H٣", "１.0"):
        with pytest.raises(BadInput, match="not a whole number \\(ASCII digits 0-9\\)"):
            parse_head(text, "--head")
    with pytest.raises(BadInput, match=r"^--head '1\.²': the head '²': not a whole number"):
        parse_head("1.²", "--head")


@settings(max_examples=300)
@given(st.text(max_size=30))
def test_any_text_is_a_value_or_one_bad_input(text):
    """Whatever is typed, each parser returns its kind or raises BadInput naming the option:
    never another exception (ValueError, IndexError, RecursionError...)."""
    for fn, kind in ((parse, (Block, Head, Expert, Site)), (parse_block, Block),
                     (parse_head, Head), (parse_expert, Expert), (parse_site, Site),
                     (parse_position, Position), (parse_selection, Selection)):
        try:
            value = fn(text, "--opt")
        except BadInput as e:
            assert str(e).startswith("--opt"), e
            assert "\n" not in str(e).replace(text, "")
        else:
            assert isinstance(value, kind)
            assert all(c.isascii() for c in str(value))


# ---------------------------------------------------------------- typed values in Python

def test_typed_values_take_ints_only():
    import numpy as np

    assert Head(np.int64(3), 1) == Head(3, 1) and type(Head(np.int64(3), 1).layer) is int
    for bad in ("1", 1.0, True, None):
        with pytest.raises(BadInput, match="must be an int"):
            Head(bad, 0)
    with pytest.raises(BadInput, match="is not a point inside a block"):
        Site(0, Point.logits)
    with pytest.raises(BadInput, match="'nope' is not a trace point"):
        Site(0, "nope")
    assert Site(0, "q") == Site(0, Point.q)
    with pytest.raises(BadInput, match="the range 3-1 is reversed"):
        Selection(((3, 1),))


def test_equal_values_hash_alike_wherever_they_were_typed():
    assert parse_head("L1H0", "--head") == Head(1, 0) == parse_head("1.0", "--qk")
    assert len({parse_head("L1H0", "--head"), Head(1, 0)}) == 1


# ---------------------------------------------------------------- resolution

def test_out_of_range_names_the_model_and_its_sizes():
    with pytest.raises(BadInput, match=r"^--head 5\.0: tiny-gpt2 has 2 blocks; the block is 0 "
                       r"to 1 \(or -1 to -2 from the end\)$"):
        resolve_head(parse_head("5.0", "--head"), TINY, "heads")
    with pytest.raises(BadInput, match=r"^heads=Head\(1, 2\): each block of tiny-gpt2 has 2 "
                       r"heads; the head is 0 to 1"):
        resolve_head(Head(1, 2), TINY, "heads")
    with pytest.raises(BadInput, match=r"^layer=-3: tiny-gpt2 has 2 blocks"):
        resolve_block(-3, TINY, "layer")
    with pytest.raises(BadInput, match=r"^--expert L1E0: tiny-gpt2 has no experts"):
        resolve_expert(parse_expert("L1E0", "--expert"), TINY, "experts")
    with pytest.raises(BadInput, match=r"^experts=Expert\(0, 16\): each block of tiny-moe has "
                       r"16 experts; the expert is 0 to 15"):
        resolve_expert(Expert(0, 16), MOE, "experts")
    with pytest.raises(BadInput, match=r"^--key 9: the prompt has 6 tokens; the position is 0 "
                       r"to 5 \(or -1 to -6 from the end\)$"):
        resolve_position(parse_position("9", "--key"), 6, "key")
    with pytest.raises(BadInput, match=r"^head='1.2': give a Head"):
        resolve_head("1.2", TINY, "head")


def test_negative_indices_resolve_from_the_end():
    assert resolve_head(Head(-1, -2), MOE, "heads") == Head(3, 6)
    assert resolve_block(Block(-1), TINY, "layer") == Block(1)
    assert resolve_block(-2, TINY, "layer") == Block(0)
    assert resolve_expert(parse_expert("-1.-1", "--expert"), MOE, "experts") == Expert(3, 15)
    assert resolve_site(parse_site("blocks.-1.attn.q", "--site"), MOE, "site") == Site(3, Point.q)
    assert resolve_position(parse_position("last", "--query"), 6, "query") == 5
    assert resolve_position(-6, 6, "query") == 0


def test_selections_resolve_to_sorted_indices():
    sel = parse_selection("7,0-2,-1,1", "--positions")
    assert resolve_selection(sel, 10, "positions", "the prompt", "position", "token") == \
        (0, 1, 2, 7, 9)
    assert resolve_selection(parse_selection("0--1", "--p"), 4, "p", "m", "block") == (0, 1, 2, 3)
    assert resolve_selection(ALL, 4, "p", "m", "block") is None
    assert resolve_selection(None, 4, "p", "m", "block") is None
    assert resolve_selection([3, -1, 3], 5, "layers", "m", "block") == (3, 4)
    with pytest.raises(BadInput, match=r"^--p 3--3: the range 3--3 is 3-1, which is reversed"):
        resolve_selection(parse_selection("3--3", "--p"), 4, "p", "m", "block")
    with pytest.raises(BadInput, match=r"^layers=\[\]: give a non-empty list"):
        resolve_selection([], 4, "layers", "m", "block")
    with pytest.raises(BadInput, match=r"^layers='0-3': give a non-empty list of ints"):
        resolve_selection("0-3", 4, "layers", "m", "block")
    with pytest.raises(BadInput, match=r"^layers=\[0, 'x'\]: the block must be an int"):
        resolve_selection([0, "x"], 4, "layers", "m", "block")


def test_a_huge_range_is_checked_before_it_is_expanded():
    sel = parse_selection("0-999999999", "--deep-layers")
    start = time.perf_counter()
    with pytest.raises(BadInput, match="^--deep-layers 0-999999999: tiny-gpt2 has 2 blocks"):
        resolve_selection(sel, 2, "layers", "tiny-gpt2", "block")
    assert time.perf_counter() - start < 0.5


def test_sizes_are_the_models_own():
    """`sizes(lm)`, what every command resolves against, is what the model's config says."""
    from conftest import tiny_gpt2

    from fptrace.core.trace import sizes
    from fptrace.models.loading import load_model

    lm = load_model(tiny_gpt2(), random_weights=True, device="cpu")
    s = sizes(lm)
    assert (s.model, s.blocks, s.heads, s.experts) == (
        "tiny-gpt2", lm.model.config.n_layer, lm.model.config.n_head, None)
    assert len(lm.model.transformer.h) == s.blocks


def test_the_table_of_docs_addresses_is_what_the_parser_does():
    """Every row of docs/addresses.md's "What you type" table: the text parses to the value the
    row names, and the value prints as the row says (where it gives a form)."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "addresses.md").read_text(
        encoding="utf-8")
    table = doc.split("## What you type", 1)[1].split("\n\n", 2)[1]
    parsers = {"block": parse_block, "head": parse_head, "expert": parse_expert,
               "site": parse_site, "position": parse_position, "selection": parse_selection}
    rows = [r for r in table.splitlines() if r.startswith("| ") and "`" in r]
    assert len(rows) >= 20
    for row in rows:
        kind, typed, value, printed = (c.strip() for c in row.strip("|").split("|"))
        text, want = typed.strip("`"), value.strip("`")
        got = parsers[kind](text, "--x")
        assert repr(got) == want, row
        shown = re.match(r"`([^`]+)`", printed)
        if shown:
            assert str(got) == shown.group(1), row
            assert parsers[kind](str(got), "--x") == got
