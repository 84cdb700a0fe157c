"""What weights a model holds, by content: a fingerprint of its tensors (names, dtypes, shapes
and bytes), so that statistics of two different models that share a name (two seeds of random
weights, two folders both called tiny-gpt2) are never mixed, and the same weights under another
path are known as the same.

Hashing every byte of a large model takes a while, so a model read from files is hashed once:
the fingerprint is kept under the GGUF cache's root, keyed by each weight file's key (size,
modification time and its first and last 8 MiB, as the GGUF cache keys its entries) and the
dtype the tensors were loaded in.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def weights_fingerprint(lm: LoadedModel) -> str | None:
    """A short hex digest of the loaded model's tensors, or None where they cannot all be read
    here (weights offloaded to disk, sharded over ranks)."""
    files = [] if lm.random_weights else _weight_files(lm.source)
    key = _cache_key(files, lm) if files else None
    if key is not None:
        cached = _read_cached(key)
        if cached is not None:
            return cached
    try:
        fp = tensors_fingerprint(lm.model)
    except (RuntimeError, NotImplementedError, ValueError, TypeError, AttributeError):
        # meta tensors, DTensors, quantized tensor subclasses
        return None
    if key is not None:
        _store(key, fp)
    return fp


def tensors_fingerprint(model: Any) -> str:
    """The digest of every tensor of the state dict, in name order (tied tensors once each
    name: the state dict lists them under each)."""
    import torch

    h = hashlib.blake2b(digest_size=16)
    for name, t in sorted(model.state_dict().items()):
        t = t.detach()
        if t.device.type == "meta":
            raise ValueError(f"{name} is not in memory")
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        flat = t.cpu().contiguous().reshape(-1)
        step = 1 << 24  # a bounded copy at a time
        for i in range(0, flat.numel(), step):
            h.update(flat[i:i + step].view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _weight_files(source: str) -> list[str]:
    if os.path.isfile(source):
        return [source]
    if os.path.isdir(source):
        return sorted(os.path.join(source, f) for f in os.listdir(source)
                      if f.endswith(WEIGHT_FILES))
    return []


def _cache_key(files: list[str], lm: LoadedModel) -> str | None:
    from fptrace.models.gguf_cache import file_key

    h = hashlib.sha256(f"{lm.dtype}|{lm.quantization}|".encode())
    try:
        for f in files:
            h.update(f"{os.path.basename(f)}|{file_key(f)}|".encode())
    except OSError:
        return None
    return h.hexdigest()[:32]


def _path(key: str) -> str:
    from fptrace.models.gguf_cache import cache_root

    return os.path.join(cache_root(), "fingerprints", f"{key}.json")


def _read_cached(key: str) -> str | None:
    try:
        with open(_path(key), encoding="utf-8") as f:
            value = json.load(f).get("weights")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _store(key: str, fp: str) -> None:
    from fptrace.atomic import write_text_atomic

    try:
        os.makedirs(os.path.dirname(_path(key)), exist_ok=True)
        write_text_atomic(_path(key), json.dumps({"weights": fp}) + "\n", ".json")
    except Exception:  # noqa: BLE001 - a cache that cannot be written costs time, not truth
        pass


__all__ = ["tensors_fingerprint", "weights_fingerprint"]
