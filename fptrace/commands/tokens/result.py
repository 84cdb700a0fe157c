"""The result of `fptrace tokens`."""

from __future__ import annotations

from fptrace.results import SCHEMA_VERSION, result

# 1.6: `fptrace tokens` (this kind); --ids on the commands that take a prompt
SCHEMA_SINCE = "1.6"


@result
class TokenPiece:
    """One token: its id, its vocabulary piece and its text."""

    position: int
    """Position in the sequence, from 0."""
    id: int
    """Token id."""
    piece: str | None
    """The vocabulary's own string for the id (`convert_ids_to_tokens`: 'Ġcat', '▁Paris',
    '<0x0A>'); null where the tokenizer lacks the id or keeps no piece strings."""
    text: str
    """The id decoded alone (`decode([id])`)."""
    special: bool
    """True for a special token of the tokenizer (begin or end of text, padding, a chat
    marker)."""
    start: int | None = None
    """For a text: the byte offset in its UTF-8 where the token starts (an added token that
    spells no character has start = end); null for ids given, or where the tokenizer keeps no
    offsets."""
    end: int | None = None
    """For a text: the byte offset where the token ends (exclusive)."""


@result
class Tokenization:
    """`fptrace tokens --json`: the ids a tokenizer makes of a text (TEXT), or what given ids
    are (--ids, --ids-file)."""

    model: str
    """The model whose tokenizer it is."""
    tokenizer: str
    """The tokenizer's name."""
    vocab_size: int
    """The model's vocabulary size (ids run from 0 to vocab_size - 1)."""
    text: str | None
    """The text tokenized; null for ids given."""
    from_ids: bool
    """True when token ids were given (--ids, --ids-file) rather than a text."""
    tokens: tuple[TokenPiece, ...]
    """One entry per token, in order."""
    decoded: str
    """The ids decoded together (`decode(ids)`): for a text, the text back, special tokens
    spelled out."""
    retokenized: tuple[int, ...] | None
    """For ids given: the ids their decoded text tokenizes to, where they differ from the ids
    (with and without the tokens the tokenizer adds to a whole prompt); null where they are the
    same, and for a text."""
    notes: tuple[str, ...]
    """What the tokenization says: the begin-of-text token added or not, other ids on
    tokenizing again."""
    seconds: float
    """Time taken, the tokenizer's loading included."""
    kind: str = "tokens"
    schema_version: str = SCHEMA_VERSION
