"""The GGUF cache: a GGUF file is dequantized once and kept as safetensors (with its
tokenizer) under cache_root(); an entry is published atomically with a manifest written last,
so an interrupted build is never mistaken for a complete one."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from typing import TYPE_CHECKING, Any

from fptrace.errors import ModelLoadError
from fptrace.models import gguf_reader
from fptrace.models.devices import alias_tied_offload
from fptrace.models.gguf_metadata import GGUFMetadata, config_overrides, loader_gap, unreadable
from fptrace.models.gguf_metadata import check as check_metadata
from fptrace.models.sources import NO_HUB_KERNELS, short_error
from fptrace.models.tokenizers import HFTokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Progress = Callable[[str], None]


CACHE_ENV = "FPTRACE_CACHE_DIR"


# 2: the config holds what transformers' GGUF loader misses (the family's gguf_config)
CACHE_FORMAT = 2


MANIFEST = "fptrace-cache.json"


def cache_root() -> str:
    """Where dequantized GGUF weights are kept: $FPTRACE_CACHE_DIR, else
    $XDG_CACHE_HOME/fptrace, else ~/.cache/fptrace."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return os.path.expanduser(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fptrace")


def file_key(path: str) -> str:
    """Changes when the file changes: size, mtime, and hashes of its first and last 8 MiB."""
    st = os.stat(path)
    h = hashlib.sha256()
    h.update(f"{CACHE_FORMAT}|{st.st_size}|{st.st_mtime_ns}|".encode())
    chunk = 8 << 20
    with open(path, "rb") as f:
        h.update(f.read(chunk))
        if st.st_size > chunk:
            f.seek(max(st.st_size - chunk, chunk))
            h.update(f.read(chunk))
    with contextlib.suppress(metadata.PackageNotFoundError):  # read without importing it
        h.update(metadata.version("transformers").encode())
    return h.hexdigest()[:32]


def entry_ok(folder: str) -> bool:
    """A complete entry has a manifest, written last, whose file sizes all match."""
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        if manifest.get("format") != CACHE_FORMAT:
            return False
        return all(os.path.getsize(os.path.join(folder, name)) == size
                   for name, size in manifest["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def publish(tmp: str, final: str, source: str) -> None:
    files = {}
    for root, _, names in os.walk(tmp):
        for n in names:
            p = os.path.join(root, n)
            files[os.path.relpath(p, tmp)] = os.path.getsize(p)
    with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
        json.dump({"format": CACHE_FORMAT, "source": source, "files": files,
                   "created": time.time()}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    shutil.rmtree(final, ignore_errors=True)
    try:
        os.replace(tmp, final)
    except OSError:  # another process published the same entry first
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def building(parent: str):
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".building-", dir=parent)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def gguf_entry(path: str) -> str:
    return os.path.join(cache_root(), "gguf", file_key(path))


def gguf_tokenizer(path: str, progress: Progress) -> HFTokenizer:
    from transformers import AutoTokenizer

    entry = os.path.join(gguf_entry(path), "tokenizer")
    if entry_ok(entry):
        try:
            return HFTokenizer(AutoTokenizer.from_pretrained(entry), os.path.basename(path))
        except Exception:
            shutil.rmtree(entry, ignore_errors=True)
    progress(f"reading the tokenizer of {os.path.basename(path)} (once; cached in {entry})")
    try:
        tok = tokenizer_from_gguf(path)
    except Exception as e:
        raise ModelLoadError(f"cannot read the tokenizer of the GGUF file {path}: "
                             f"{short_error(e)}") from None
    with building(os.path.dirname(entry)) as tmp:
        tok.save_pretrained(tmp)
        publish(tmp, entry, path)
    return HFTokenizer(tok, os.path.basename(path))


def tokenizer_from_gguf(path: str) -> PreTrainedTokenizerBase:
    """transformers' tokenizer of the GGUF file at `path`, converted from its tokenizer.*
    keys. AutoTokenizer reads the file's config first and fails on an architecture its GGUF
    loader does not read; the conversion itself depends on the tokenizer's model (BPE,
    SentencePiece), so such a file's tokenizer is built by the generic fast tokenizer."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    if gguf_reader.reads(check_metadata(path)):
        return PreTrainedTokenizerFast.from_pretrained(folder, gguf_file=name)
    return AutoTokenizer.from_pretrained(folder, gguf_file=name)


def gguf_model(path: str, dtype: Any, progress: Progress, placed: dict | None = None) -> Any:
    """The dequantized model, always read from the cache entry (built first when missing),
    so that the run that dequantizes computes what every later run computes, bit for bit (the
    model transformers' GGUF reader builds in memory holds its weights otherwise: its last
    digits differed). Read into memory, not mapped (a truncated file is no SIGBUS). `placed`:
    more from_pretrained arguments, a device map or a quantization."""
    from transformers import AutoModelForCausalLM

    meta = check_metadata(path)  # what llama.cpp would abort on, transformers fails on unclearly
    entry = os.path.join(gguf_entry(path), "model")
    for attempt in range(2):  # a cache entry that cannot be read is rebuilt once
        if not entry_ok(entry):
            _dequantize(path, entry, progress, meta)
        try:
            return alias_tied_offload(AutoModelForCausalLM.from_pretrained(
                entry, dtype=dtype, disable_mmap=True, **NO_HUB_KERNELS, **(placed or {})))
        except Exception as e:
            if attempt:
                raise ModelLoadError(f"cannot read the cache entry {entry} built from {path}: "
                                     f"{short_error(e)}") from None
            progress(f"cache entry {entry} is unreadable ({short_error(e)}); rebuilding it")
            shutil.rmtree(entry, ignore_errors=True)
    raise AssertionError("unreachable")


def _dequantize(path: str, entry: str, progress: Progress, meta: GGUFMetadata) -> None:
    """Dequantize the GGUF file through transformers' GGUF reader into the cache entry (a
    float32 safetensors folder), published whole or not at all."""
    import torch
    from transformers import AutoModelForCausalLM

    if gguf_reader.reads(meta):  # an architecture transformers' loader does not read
        progress(f"dequantizing {os.path.basename(path)} (once; cached in {entry})")
        publish_model(gguf_reader.build(path, meta), entry, path)
        return
    gap = loader_gap(meta)
    if gap is not None:
        raise ModelLoadError(f"cannot read the GGUF file {path}: {gap}")
    progress(f"dequantizing {os.path.basename(path)} (once, ~20 s; cached in {entry})")
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path),
            dtype=torch.float32, output_loading_info=True, **NO_HUB_KERNELS,
            **config_overrides(meta))
    except Exception as e:
        raise ModelLoadError(f"cannot read the GGUF file {path}: "
                             f"{unreadable(meta.architecture, e)}") from None
    # the loader leaves a weight it found no tensor for at its random initial value, with a
    # warning only: a model computed from it would be silently wrong
    model, info = loaded
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ModelLoadError(
            f"cannot read the GGUF file {path}: transformers' GGUF loader found no tensor for "
            f"{len(missing)} of the model's weights ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}) and would leave them at random values")
    publish_model(model, entry, path)


def publish_model(model: PreTrainedModel, entry: str, path: str) -> None:
    """The dequantized model as the cache entry: its config and float32 safetensors."""
    from safetensors.torch import save_model

    with building(os.path.dirname(entry)) as tmp:
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=1)
        save_model(model, os.path.join(tmp, "model.safetensors"))
        publish(tmp, entry, path)
