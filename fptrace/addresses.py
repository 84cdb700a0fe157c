"""One address for a place in the model: a block, a head, an expert, a trace point inside a block,
and a selection of blocks or positions; one parser for what a user types, one printer.

What a user types (the grammar, also in docs/addresses.md):

    block      23   L23   -1                       -1 counts from the end (the last block)
    head       23.4   L23H4   l23h4                 head 4 of block 23 (printed 23.4)
    expert     23.4 (where an expert is asked for)   L23E4   l23e4   (printed L23E4)
    site       blocks.23.resid_pre   blocks.23.attn.q   blocks.23.mlp.act
               blocks.23.hook_resid_post (TransformerLens' `hook_` before the last name)
    selection  all   last   -1   0-3,7   0,4,8-9      blocks or positions; a range is inclusive,
                                                       negative numbers count from the end

Every number is ASCII digits with an optional minus sign, read by `fptrace.numbers.parse_int`
(so `²`, `٣` and `１` are refused); no spaces inside an address (a list may have spaces after
its commas); `23:4`, `1.2.3`, `1.`, `.1` and a reversed range (`3-1`) are refused with the
forms that are accepted.

The printer is `str()`: `str(Head(23, 4)) == "23.4"`, `str(Block(3)) == "3"`,
`str(Expert(23, 4)) == "L23E4"`, `str(Site(3, Point.q)) == "blocks.3.attn.q"`,
`str(Selection(((0, 3), 7))) == "0-3,7"`; `parse(str(x)) == x` for every value, and each
`parse_<kind>(str(x)) == x` for its kind.

Strings are parsed only at the command line. The Python API takes these typed values (and
plain lists of ints for selections); `resolve_*` checks them against a model's sizes (negative
indices become the ones counted from the end), and its errors name the place the value came
from: the option and the text a user typed (`--head 5.0: ...`) for a value parsed here, the
API parameter (`heads=Head(5, 0): ...`) for one built in Python.

A leaf: it imports only the other leaves.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from fptrace.errors import BadInput
from fptrace.numbers import is_int, parse_int
from fptrace.points import BLOCK, Point

MAX_DIGITS = 9  # no model has a billion blocks, heads, experts or positions
HEAD_FORMS = "give a block and a head as 23.4 or L23H4"
EXPERT_FORMS = "give a block and an expert as 23.4 or L23E4"
BLOCK_FORMS = "give a block as 23 or L23 (-1: the last block)"
SELECTION_FORMS = "give all, last, or numbers and inclusive ranges such as 0-3,7 or -1"

# where each point of a block sits in a site's name: `blocks.L.<name>`
ATTN = (Point.q, Point.k, Point.v, Point.attn_weights, Point.z)
MLP = (Point.mlp_gate, Point.mlp_up, Point.mlp_act)


def site_name(point: Point) -> str:
    """The part of a site's name after `blocks.L.`: `attn.q`, `attn.weights`, `mlp.act`, or the
    point's own name for the stream, the norms and the sublayer outputs (`resid_post`)."""
    if point in ATTN:
        return "attn." + point.value.removeprefix("attn_")
    if point in MLP:
        return "mlp." + point.value.removeprefix("mlp_")
    return point.value


SITE_NAMES = {site_name(p): p for p in BLOCK}


def _index(value: object, owner: str, part: str) -> int:
    """An index given in Python: an int (numpy and torch integers too; not a bool, a float or
    a string)."""
    if not isinstance(value, (bool, str, bytes, float)):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise BadInput(f"{owner}: the {part} must be an int, not {value!r}")


@dataclass(frozen=True)
class Block:
    """Block `layer` (from 0; negative counts from the end until resolved). Printed `23`."""

    layer: int
    origin: str | None = field(default=None, compare=False, repr=False)
    """Where the value was typed (`--layer L23`); None when built in Python."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer", _index(self.layer, "Block", "block"))

    def __str__(self) -> str:
        return str(self.layer)

    def __repr__(self) -> str:
        return f"Block({self.layer})"


@dataclass(frozen=True)
class Head:
    """Attention head `head` of block `layer`. Printed `23.4`."""

    layer: int
    head: int
    origin: str | None = field(default=None, compare=False, repr=False)
    """Where the value was typed (`--head 23.4`); None when built in Python."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer", _index(self.layer, "Head", "block"))
        object.__setattr__(self, "head", _index(self.head, "Head", "head"))

    def __str__(self) -> str:
        return f"{self.layer}.{self.head}"

    def __repr__(self) -> str:
        return f"Head({self.layer}, {self.head})"


@dataclass(frozen=True)
class Expert:
    """Expert `expert` of the mixture-of-experts MLP of block `layer`. Printed `L23E4` (`23.4`
    is a head unless an expert is asked for)."""

    layer: int
    expert: int
    origin: str | None = field(default=None, compare=False, repr=False)
    """Where the value was typed (`--expert 23.4`); None when built in Python."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer", _index(self.layer, "Expert", "block"))
        object.__setattr__(self, "expert", _index(self.expert, "Expert", "expert"))

    def __str__(self) -> str:
        return f"L{self.layer}E{self.expert}"

    def __repr__(self) -> str:
        return f"Expert({self.layer}, {self.expert})"


@dataclass(frozen=True)
class Site:
    """Trace point `point` (one of points.BLOCK) inside block `layer`. Printed
    `blocks.23.attn.q`, `blocks.23.resid_post`."""

    layer: int
    point: Point
    origin: str | None = field(default=None, compare=False, repr=False)
    """Where the value was typed (`--site blocks.3.attn.q`); None when built in Python."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer", _index(self.layer, "Site", "block"))
        try:
            point = Point(self.point)
        except ValueError:
            raise BadInput(f"Site: {self.point!r} is not a trace point") from None
        if point not in BLOCK:
            raise BadInput(f"Site: {point.value} is not a point inside a block (those are "
                           f"{', '.join(p.value for p in BLOCK)})")
        object.__setattr__(self, "point", point)

    def __str__(self) -> str:
        return f"blocks.{self.layer}.{site_name(self.point)}"

    def __repr__(self) -> str:
        return f"Site({self.layer}, Point.{self.point.value})"


@dataclass(frozen=True)
class Position:
    """Position `index` of the prompt (negative counts from the end: -1 is the last token).
    Printed `3`, `-1`."""

    index: int
    origin: str | None = field(default=None, compare=False, repr=False)
    """Where the value was typed (`--query last`); None when built in Python."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", _index(self.index, "Position", "position"))

    def __str__(self) -> str:
        return str(self.index)

    def __repr__(self) -> str:
        return f"Position({self.index})"


@dataclass(frozen=True)
class Index:
    """A number within a block: head `index` of the block a command already names (explain's
    `--head 4` beside `--layer 23`); negative counts from the end. Printed `4`."""

    index: int
    origin: str | None = field(default=None, compare=False, repr=False)
    """Where the value was typed (`--head 4`); None when built in Python."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "index", _index(self.index, "Index", "index"))

    def __str__(self) -> str:
        return str(self.index)

    def __repr__(self) -> str:
        return f"Index({self.index})"


Item = int | tuple[int, int]


@dataclass(frozen=True)
class Selection:
    """Blocks or positions: every one (items None) or numbers and inclusive ranges (lo, hi), as
    typed (negative ones count from the end until resolved). Printed `all` or `0-3,7`."""

    items: tuple[Item, ...] | None
    origin: str | None = field(default=None, compare=False, repr=False)
    """Where the value was typed (`--positions 0,3`); None when built in Python."""

    def __post_init__(self) -> None:
        if self.items is None:
            return
        items: list[Item] = []
        for it in self.items:
            if isinstance(it, tuple) and len(it) == 2:
                lo, hi = (_index(x, "Selection", "range end") for x in it)
                if (lo < 0) == (hi < 0) and lo > hi:
                    raise BadInput(f"Selection: the range {lo}-{hi} is reversed")
                items.append((lo, hi))
            else:
                items.append(_index(it, "Selection", "item"))
        if not items:
            raise BadInput("Selection: give at least one item (or items=None for all)")
        object.__setattr__(self, "items", tuple(items))

    def __str__(self) -> str:
        if self.items is None:
            return "all"
        return ",".join(f"{it[0]}-{it[1]}" if isinstance(it, tuple) else str(it)
                        for it in self.items)

    def __repr__(self) -> str:
        return f"Selection({self.items!r})"


ALL = Selection(None)
Place = Block | Head | Expert | Site


# ----------------------------------------------------------------------------- parsing
def _label(text: str, what: str) -> str:
    return f"{what} {text!r}"


def _int(piece: str, label: str, part: str, forms: str) -> int:
    """One number of an address, in ASCII digits (an optional minus sign), through parse_int."""
    if piece.startswith("+") or piece != piece.strip():
        raise BadInput(f"{label}: the {part} {piece!r} is not a whole number (ASCII digits "
                       f"0-9, - to count from the end); {forms}")
    if is_int(piece) and len(piece.lstrip("-")) > MAX_DIGITS:
        raise BadInput(f"{label}: the {part} {piece!r} is too large (at most {MAX_DIGITS} "
                       f"digits)")
    try:
        value = parse_int(piece, f"{label}: the {part}")
    except BadInput as e:
        raise BadInput(f"{e}; {forms}") from None
    if value == 0 and piece.startswith("-"):  # neither the first nor one from the end
        raise BadInput(f"{label}: the {part} {piece!r} is ambiguous: 0 is the first, -1 the "
                       f"last; {forms}")
    return value


def _text(text: object, what: str, forms: str) -> str:
    if not isinstance(text, str):
        raise BadInput(f"{what}: expected text to parse, got {text!r}")
    s = text.strip()
    if not s:
        raise BadInput(f"{what} {text!r}: empty; {forms}")
    if any(c.isspace() for c in s):
        raise BadInput(f"{_label(text, what)}: no spaces inside an address; {forms}")
    return s


_LETTERS = re.compile(r"[Ll]([^HhEe]*)(?:([HhEe])(.*))?")


def parse(text: str, what: str) -> Place:
    """Any single place, by its form: `blocks.…` a site, `L23H4` or `23.4` a head, `L23E4` an
    expert, `23` or `L23` a block."""
    s = _text(text, what, "give a block (23), a head (23.4), an expert (L23E4) or a site "
                          "(blocks.23.attn.q)")
    if s.startswith("blocks."):
        return parse_site(text, what)
    m = _LETTERS.fullmatch(s)
    if m and m.group(2) and m.group(2) in "Ee":
        return parse_expert(text, what)
    if (m and m.group(2)) or "." in s:
        return parse_head(text, what)
    return parse_block(text, what)


def parse_block(text: str, what: str) -> Block:
    """`23`, `L23`, `-1` (the last block)."""
    s = _text(text, what, BLOCK_FORMS)
    label = _label(text, what)
    m = _LETTERS.fullmatch(s)
    if m and m.group(2):
        raise BadInput(f"{label}: a {'head' if m.group(2) in 'Hh' else 'expert'}, not a block; "
                       f"{BLOCK_FORMS}")
    body = m.group(1) if m else s
    return Block(_int(body, label, "block", BLOCK_FORMS), origin=f"{what} {s}")


def _pair(text: str, what: str, letter: str, part: str, forms: str) -> tuple[int, int, str]:
    s = _text(text, what, forms)
    label = _label(text, what)
    m = _LETTERS.fullmatch(s)
    if m:
        if not m.group(2):
            raise BadInput(f"{label}: a block alone; {forms}")
        if m.group(2).upper() != letter:
            other = "a head" if m.group(2) in "Hh" else "an expert"
            raise BadInput(f"{label}: {other}, not {'a head' if letter == 'H' else 'an expert'}"
                           f"; {forms}")
        a, b = m.group(1), m.group(3)
    elif "." in s:
        a, _, b = s.partition(".")
    else:
        alone = re.fullmatch("-?[0-9]+", s) is not None
        raise BadInput(f"{label}: {'a block alone' if alone else 'not a place'}; {forms}")
    return _int(a, label, "block", forms), _int(b, label, part, forms), s


def parse_head(text: str, what: str) -> Head:
    """`23.4`, `L23H4`, `l23h4`; negative numbers count from the end (`-1.-1`)."""
    layer, head, s = _pair(text, what, "H", "head", HEAD_FORMS)
    return Head(layer, head, origin=f"{what} {s}")


def parse_expert(text: str, what: str) -> Expert:
    """`23.4`, `L23E4`, `l23e4` (an option that asks for an expert)."""
    layer, expert, s = _pair(text, what, "E", "expert", EXPERT_FORMS)
    return Expert(layer, expert, origin=f"{what} {s}")


def parse_position(text: str, what: str) -> Position:
    """`3`, `-1` (the last token), `last`."""
    forms = "give a position as 3, -1 (the last token) or last"
    s = _text(text, what, forms)
    if s.lower() == "last":
        return Position(-1, origin=f"{what} {s}")
    return Position(_int(s, _label(text, what), "position", forms), origin=f"{what} {s}")


def parse_index(text: str, what: str, noun: str) -> Index:
    """`4`, `-1` (the last): a `noun` ("head") within a block named by another option."""
    forms = f"give a {noun} as 4 or -1 (the last)"
    s = _text(text, what, forms)
    return Index(_int(s, _label(text, what), noun, forms), origin=f"{what} {s}")


# the names dictionaries (SAELens, sparsify) give the MLP's input, after its norm: ln2
DICTIONARY_NAMES = {"mlp_in": Point.ln2, "ln2.normalized": Point.ln2}
# Hugging Face module names, as EleutherAI sparsify names its dictionaries' places:
# layers.L (the block's output), layers.L.mlp (the MLP's output), layers.L.mlp.input
HF_NAMES = {"": Point.resid_post, "output": Point.resid_post, "mlp": Point.mlp_out,
            "mlp.output": Point.mlp_out, "mlp.input": Point.ln2}


def parse_site(text: str, what: str) -> Site:
    """`blocks.23.resid_pre`, `blocks.23.attn.q`, `blocks.23.mlp.act`, with `hook_` allowed
    before the last name (`blocks.23.hook_resid_post`, `blocks.23.attn.hook_q`); and the names
    dictionaries are published under: `blocks.23.hook_mlp_in` and `blocks.23.ln2.hook_normalized`
    (the MLP's input: ln2), `layers.23` / `model.layers.23.output` (resid_post), `layers.23.mlp`
    (mlp_out), `layers.23.mlp.input` (ln2)."""
    forms = "give a site as blocks.23.resid_post or blocks.23.attn.q"
    s = _text(text, what, forms)
    label = _label(text, what)
    head, _, rest = s.removeprefix("model.").partition(".")
    layer_text, _, name = rest.partition(".")
    if head == "layers" and name in HF_NAMES:
        return Site(_int(layer_text, label, "block", forms), HF_NAMES[name],
                    origin=f"{what} {s}")
    if head != "blocks" or not name:
        raise BadInput(f"{label}: {forms}")
    layer = _int(layer_text, label, "block", forms)
    parts = name.split(".")
    parts[-1] = parts[-1].removeprefix("hook_")
    name = ".".join(parts)
    point = SITE_NAMES.get(name) or DICTIONARY_NAMES.get(name)
    if point is None:
        known = {p.value: site_name(p) for p in BLOCK}
        hint = f"did you mean blocks.{layer}.{known[name]}? " if name in known else ""
        raise BadInput(f"{label}: no point {name!r} inside a block; {hint}the points are "
                       f"{', '.join(SITE_NAMES)}")
    return Site(layer, point, origin=f"{what} {s}")


def parse_selection(text: str, what: str) -> Selection:
    """`all`, `last` (-1), or numbers and inclusive ranges separated by commas (`0-3,7`,
    `0,4,8-9`, `-1`, `0--1`); a reversed range (`3-1`) is refused."""
    if not isinstance(text, str):
        raise BadInput(f"{what}: expected text to parse, got {text!r}")
    s = text.strip()
    label = _label(text, what)
    if not s:
        raise BadInput(f"{label}: empty; {SELECTION_FORMS}")
    if s.lower() == "all":
        return Selection(None, origin=f"{what} all")
    items: list[Item] = []
    for raw in s.split(","):
        item = raw.strip()
        if not item:
            raise BadInput(f"{label}: an empty item between commas; {SELECTION_FORMS}")
        if any(c.isspace() for c in item):
            raise BadInput(f"{label}: no spaces inside {item!r}; {SELECTION_FORMS}")
        if item.lower() == "last":
            items.append(-1)
            continue
        if item.lower() == "all":
            raise BadInput(f"{label}: all stands alone; {SELECTION_FORMS}")
        neg = item.startswith("-")
        a, sep, b = item[1:].partition("-") if neg else item.partition("-")
        lo = _int(("-" if neg else "") + a, label, "number", SELECTION_FORMS)
        if not sep:
            items.append(lo)
            continue
        hi = _int(b, label, "end of the range", SELECTION_FORMS)
        if (lo < 0) == (hi < 0) and lo > hi:
            raise BadInput(f"{label}: the range {item} is reversed; write {hi}-{lo}")
        items.append((lo, hi))
    return Selection(tuple(items), origin=f"{what} {s}")


# ----------------------------------------------------------------------------- resolving
@dataclass(frozen=True)
class Sizes:
    """What a model has, for resolving addresses against it."""

    model: str  # its name, as errors say it ("tiny-gpt2 has 2 blocks")
    blocks: int
    heads: int
    experts: int | None = None  # per block, where the MLP is a mixture of experts


def _named(value: object, what: str) -> str:
    """Where a value came from: the option and text typed, or the API parameter and value."""
    origin = getattr(value, "origin", None)
    return origin if origin else f"{what}={value!r}"


def _within(i: int, n: int, label: str, whose: str, noun: str, counted: str | None = None
            ) -> int:
    """i within n things, negative counted from the end; the error says what the model (or
    the prompt) has: "tiny-gpt2 has 2 blocks; the block is 0 to 1 (or -1 to -2 from the end)"."""
    if not -n <= i < n:
        raise BadInput(f"{label}: {whose} has {n} {counted or noun}s; the {noun} is 0 to "
                       f"{n - 1} (or -1 to -{n} from the end)")
    return i % n


def _check_type(value: object, kind: type, what: str, example: str) -> None:
    if not isinstance(value, kind):
        raise BadInput(f"{what}={value!r}: give a {kind.__name__} ({example}), not "
                       f"{type(value).__name__}")


def resolve_block(value: Block | int, sizes: Sizes, what: str) -> Block:
    """A block (or an int) checked against the model, negative counted from the end."""
    label = _named(value, what)
    if not isinstance(value, Block):
        value = Block(_index(value, label, "block"))
    i = _within(value.layer, sizes.blocks, label, sizes.model, "block")
    return Block(i, origin=value.origin)


def resolve_head(value: Head, sizes: Sizes, what: str) -> Head:
    """A head checked against the model (its blocks and heads per block)."""
    _check_type(value, Head, what, "fptrace.Head(23, 4)")
    label = _named(value, what)
    layer = _within(value.layer, sizes.blocks, label, sizes.model, "block")
    head = _within(value.head, sizes.heads, label, f"each block of {sizes.model}", "head")
    return Head(layer, head, origin=value.origin)


def resolve_expert(value: Expert, sizes: Sizes, what: str) -> Expert:
    """An expert checked against the model (its blocks and experts per block)."""
    _check_type(value, Expert, what, "fptrace.Expert(23, 4)")
    label = _named(value, what)
    if not sizes.experts:
        raise BadInput(f"{label}: {sizes.model} has no experts (its MLPs are not a mixture of "
                       "experts)")
    layer = _within(value.layer, sizes.blocks, label, sizes.model, "block")
    expert = _within(value.expert, sizes.experts, label, f"each block of {sizes.model}",
                     "expert")
    return Expert(layer, expert, origin=value.origin)


def resolve_site(value: Site, sizes: Sizes, what: str) -> Site:
    """A site checked against the model's blocks."""
    _check_type(value, Site, what, "fptrace.Site(3, Point.q)")
    layer = _within(value.layer, sizes.blocks, _named(value, what), sizes.model, "block")
    return Site(layer, value.point, origin=value.origin)


def resolve_position(value: Position | int, T: int, what: str) -> int:
    """A position (or an int) of a prompt of T tokens, as an index from 0."""
    label = _named(value, what)
    if not isinstance(value, Position):
        value = Position(_index(value, label, "position"))
    return _within(value.index, T, label, "the prompt", "position", "token")


def resolve_index(value: Index | int, n: int, what: str, whose: str, noun: str) -> int:
    """An index (or an int) among n `noun`s of `whose` ("each block of tiny-gpt2"), from 0."""
    label = _named(value, what)
    if not isinstance(value, Index):
        value = Index(_index(value, label, noun))
    return _within(value.index, n, label, whose, noun)


def many(value: object, kind: type, what: str) -> list:
    """An API parameter that takes several values of a kind (`heads=[Head(1, 2)]`): a list, a
    tuple or another iterable of them, never a string (whose characters would be taken one by
    one)."""
    if isinstance(value, (str, bytes, Block, Head, Expert, Site)) or \
            not hasattr(value, "__iter__"):
        raise BadInput(f"{what}={value!r}: give a list of {kind.__name__} values, e.g. "
                       f"{what}=[{EXAMPLES[kind]}]")
    return list(value)  # type: ignore[call-overload]


EXAMPLES = {Block: "0, 3", Head: "fptrace.Head(23, 4)", Expert: "fptrace.Expert(23, 4)",
            Site: "fptrace.Site(3, Point.q)"}


def resolve_selection(value: Selection | Sequence[int] | None, n: int, what: str,
                      whose: str, noun: str, counted: str | None = None
                      ) -> tuple[int, ...] | None:
    """A selection of n things (`noun`s of `whose`: "block"s of "tiny-gpt2", "position"s of
    "the prompt", which has n `counted`s: "tokens") as sorted indices from 0, repeats
    dropped; None for all. A Python list of ints is a selection of those items."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (Selection, Sequence)) or \
            (not isinstance(value, Selection) and len(value) == 0):
        raise BadInput(f"{what}={value!r}: give a non-empty list of ints (negative ones count "
                       "from the end) or None for all")
    sel = value if isinstance(value, Selection) else Selection(tuple(
        _index(x, f"{what}={value!r}", noun) for x in value))
    if sel.items is None:
        return None
    label = _named(sel, what) if isinstance(value, Selection) else f"{what}={value!r}"
    out: set[int] = set()
    for it in sel.items:
        lo, hi = it if isinstance(it, tuple) else (it, it)
        a, b = (_within(x, n, label, whose, noun, counted) for x in (lo, hi))
        if a > b:
            raise BadInput(f"{label}: the range {lo}-{hi} is {a}-{b}, which is reversed")
        out.update(range(a, b + 1))
    return tuple(sorted(out))


__all__ = ["ALL", "Block", "Expert", "Head", "Index", "Place", "Position", "Selection", "Site",
           "Sizes", "many", "parse", "parse_block", "parse_expert", "parse_head", "parse_index",
           "parse_position", "parse_selection", "parse_site", "resolve_block", "resolve_expert",
           "resolve_head", "resolve_index", "resolve_position", "resolve_selection",
           "resolve_site", "site_name"]
