"""What a model's tokenizer makes of a text, or what token ids are: the tokenizer alone is
loaded, from local files (as `shapes` does), never the weights."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from fptrace.commands.tokens.notes import NOT_IN_TOKENIZER
from fptrace.commands.tokens.result import Tokenization, TokenPiece
from fptrace.errors import BadInput, PromptTooLong


def _facts(spec: Any) -> tuple[int, int | None]:
    """The model's vocabulary size and context length, from its config: a known model's stored
    dict or a folder's config.json as written, without importing transformers (its config class
    otherwise)."""
    from fptrace.models.sources import load_config, read_json

    cfg = spec.known.config if spec.known is not None else None
    if cfg is None and spec.kind == "folder":
        cfg = read_json(os.path.join(spec.path, "config.json"))
    if cfg is None or "vocab_size" not in cfg:
        cfg = load_config(spec).to_dict()
    ctx = cfg.get("max_position_embeddings", cfg.get("n_positions"))
    return int(cfg["vocab_size"]), None if ctx is None else int(ctx)


def tokens(model: str, prompt: str | Sequence[int]) -> Tokenization:
    """The tokens of `prompt` under `model`'s tokenizer: a text's ids, pieces and byte offsets
    (the begin-of-text token added or not, said), or each given id's piece, decoded text and
    whether it is special (and whether the text the ids spell tokenizes back to them)."""
    from fptrace.models.loading import bos_said, check_vocabulary, retokenized
    from fptrace.models.registry import resolve
    from fptrace.models.tokenizer_cache import quick_tokenizer
    from fptrace.models.tokenizers import encode_prompt

    t0 = time.perf_counter()
    spec = resolve(model)
    vocab, ctx = _facts(spec)
    tok = quick_tokenizer(spec, lambda m: None)
    if tok is None:
        raise BadInput(f"no tokenizer for {spec.name} is available offline")
    from_ids = not isinstance(prompt, str)
    if isinstance(prompt, str):
        ids = encode_prompt(tok, prompt)
        spans = _byte_spans(prompt, tok.spans(prompt))
    else:
        ids = [int(i) for i in prompt]
        if not ids:
            raise BadInput("no token ids")
        check_vocabulary(ids, vocab, spec.name)
        if ctx and len(ids) > ctx:
            raise PromptTooLong(f"the {len(ids):,} ids are more than {spec.name} reads (at most "
                                f"{ctx:,})", len(ids), ctx)
        spans = None
    known = tok.size()
    special = tok.special_ids()
    rows = tuple(TokenPiece(
        position=k, id=i, piece=tok.piece(i) if i < known else None,
        text=tok.decode([i]) if i < known else "", special=i in special,
        start=spans[k][0] if spans else None, end=spans[k][1] if spans else None)
        for k, i in enumerate(ids))
    notes = [n for n in (bos_said(tok, ids, from_ids),) if n]
    again = None
    if from_ids and all(i < known for i in ids):
        said = retokenized(tok, ids)
        if said:
            notes.append(said)
            again = tuple(tok.encode(tok.decode(ids)))
    lacking = [i for i in ids if i >= known]
    if lacking:
        notes.append(NOT_IN_TOKENIZER(k=len(lacking), first=lacking[0], vocab=vocab,
                                      known=known))
    return Tokenization(
        model=spec.name, tokenizer=tok.name, vocab_size=vocab,
        text=None if from_ids else str(prompt), from_ids=from_ids, tokens=rows,
        decoded=tok.decode([i for i in ids if i < known]), retokenized=again,
        notes=tuple(notes), seconds=time.perf_counter() - t0)


def _byte_spans(text: str, spans: list[tuple[int, int]] | None
                ) -> list[tuple[int, int]] | None:
    """Character spans as byte offsets in the text's UTF-8."""
    if spans is None:
        return None
    at = [0]
    for ch in text:
        at.append(at[-1] + len(ch.encode("utf-8")))
    return [(at[a], at[b]) for a, b in spans]
