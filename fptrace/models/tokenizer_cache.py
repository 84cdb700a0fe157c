"""A model's tokenizer as transformers resolved it, kept in the cache so that a later call
reads it with the `tokenizers` library alone: `fptrace tokens` answers without importing
transformers (5 s on a 2-core machine) once an earlier call has read the tokenizer.

What is kept is `HFTokenizer.state()`: the `tokenizers` pipeline after transformers' own load
(the special tokens it added, the post-processor it rebuilt), the named ids, the special ids and
the size; a tokenizer for which transformers computes more than that pipeline is not kept, and is
read through transformers every time. An entry is keyed by its source: a GGUF file's key (its
size, time and bytes, the transformers version), or a folder's path and the name, size and time
of every file in it; an entry is published whole or not at all (models/gguf_cache.py)."""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from typing import Any

from fptrace.models.gguf_cache import Progress, building, cache_root, entry_ok, file_key, publish
from fptrace.models.loading import tokenizer_for
from fptrace.models.registry import ModelSpec
from fptrace.models.tokenizers import HFTokenizer, RawTokenizer, TextTokenizer

STATE = "tokenizer-state.json"
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt")


def _versions() -> str:
    got = []
    for package in ("transformers", "tokenizers"):
        try:
            got.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            got.append(f"{package} -")
    return "|".join(got)


def _key(spec: ModelSpec) -> str | None:
    """The entry's name for the model's tokenizer source; None for a source not kept (a hub id:
    finding its files needs huggingface_hub; known models' offline tokenizers need no cache)."""
    h = hashlib.sha256(_versions().encode())
    if spec.kind == "gguf" and spec.path:
        h.update(f"gguf|{file_key(spec.path)}".encode())
    elif spec.kind == "folder" and spec.path:
        folder = os.path.abspath(spec.path)
        h.update(f"folder|{folder}".encode())
        try:
            names = sorted(os.listdir(folder))
            for n in names:
                p = os.path.join(folder, n)
                if n.endswith(WEIGHTS) or not os.path.isfile(p):
                    continue
                st = os.stat(p)
                h.update(f"|{n}|{st.st_size}|{st.st_mtime_ns}".encode())
        except OSError:
            return None
    else:
        return None
    return h.hexdigest()[:32]


def _read(entry: str) -> RawTokenizer | None:
    if not entry_ok(entry):
        return None
    try:
        with open(os.path.join(entry, STATE), encoding="utf-8") as f:
            state: dict[str, Any] = json.load(f)
        return RawTokenizer.from_state(state)
    except Exception:  # noqa: BLE001 - an entry this version cannot read: read it again
        return None


def _keep(entry: str, state: dict[str, Any]) -> None:
    try:
        with building(os.path.dirname(entry)) as tmp:
            with open(os.path.join(tmp, STATE), "w", encoding="utf-8") as f:
                json.dump(state, f)
            publish(tmp, entry, state["name"])
    except OSError:  # a cache that cannot be written: the next call reads transformers again
        pass


def quick_tokenizer(spec: ModelSpec, progress: Progress) -> TextTokenizer | None:
    """The model's tokenizer (tokenizer_for's answer), from the cache where an earlier call kept
    it, else through transformers and kept for the next call."""
    key = _key(spec)
    if key is None:
        return tokenizer_for(spec, None, progress)
    entry = os.path.join(cache_root(), "tokenizers", key)
    kept = _read(entry)
    if kept is not None:
        return kept
    tok = tokenizer_for(spec, None, progress)
    if isinstance(tok, HFTokenizer):
        state = tok.state()
        if state is not None:
            _keep(entry, state)
    return tok


__all__ = ["quick_tokenizer"]
