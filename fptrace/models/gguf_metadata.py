"""A GGUF file's metadata, read fast and checked before any engine is handed the file.

llama.cpp asserts on some hyperparameters instead of refusing them, which aborts the whole
process (a server with it): `block_count` 0 or above LLAMA_MAX_LAYERS (512) in
`llama_model_base::load_hparams`, an RMS epsilon that is NaN or negative in ggml-cpu's
`ggml_compute_forward_rms_norm` (`GGML_ASSERT(eps >= 0.0f)`, at the first pass). transformers
fails on the same files with an IndexError (no blocks). `check()` is the one place both engines
refuse such a file, in one line naming the key and its value; the header is read here with a
small parser (the gguf package's GGUFReader builds every token string and takes ~7 s on the
bundled model, this ~0.1 s).

Keys are named `{architecture}.{name}` (`llama.block_count`). A hyperparameter can be a scalar
or, in models whose layers differ, an array with one value per block.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass, field
from typing import Any

from fptrace.errors import ModelLoadError

MAGIC = b"GGUF"
# llama.cpp's LLAMA_MAX_LAYERS: block_count above it fails an assert that aborts
MAX_LAYERS = 512
# numeric arrays up to this length keep their values (per-block hyperparameters); longer ones
# (token types, scores) are skipped, only their length is kept
KEEP_ARRAY = 4096
# enum gguf_type: struct format of each fixed-size value type
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
          12: "d"}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFMetadata:
    """What the header of a GGUF file states."""

    path: str
    values: dict[str, Any] = field(repr=False)  # key -> scalar, str, or tuple (array)
    array_lengths: dict[str, int] = field(repr=False)  # every array key -> its length
    shapes: dict[str, tuple[int, ...]] = field(repr=False)  # tensor -> ggml dims (ne order)

    @property
    def architecture(self) -> str | None:
        arch = self.values.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def hparam(self, name: str) -> Any:
        """`{architecture}.{name}`, or None."""
        return self.values.get(f"{self.architecture}.{name}")

    @property
    def experts(self) -> bool:
        """The file states routed experts (`{arch}.expert_count` above 0): llama.cpp's own rule
        for building them, which tells Mixtral's `llama` files from Llama's."""
        n = self.hparam("expert_count")
        return isinstance(n, int) and not isinstance(n, bool) and n > 0

    @property
    def context_length(self) -> int | None:
        n = self.hparam("context_length")
        return int(n) if isinstance(n, int) and not isinstance(n, bool) else None


class Reader:
    """Bounds-checked little-endian reads over the mapped file."""

    def __init__(self, buf: mmap.mmap, path: str):
        self.buf, self.path, self.at = buf, path, 0

    def damaged(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"the GGUF file {self.path!r} is damaged: {what} (at byte "
                              f"{self.at:,} of {len(self.buf):,})")

    def take(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        if self.at + size > len(self.buf):
            raise self.damaged("it ends inside its header")
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.at)
        self.at += size
        return value

    def skip(self, n: int) -> None:
        if n < 0 or self.at + n > len(self.buf):
            raise self.damaged("it ends inside its header")
        self.at += n

    def string(self) -> str:
        n = int(self.take("Q"))
        start = self.at
        self.skip(n)
        return bytes(self.buf[start:self.at]).decode("utf-8", "replace")

    def value(self, kind: int, key: str, lengths: dict[str, int]) -> Any:
        if kind in SCALAR:
            return self.take(SCALAR[kind])
        if kind == STRING:
            return self.string()
        if kind != ARRAY:
            raise self.damaged(f"key {key!r} has the unknown value type {kind}")
        inner, n = int(self.take("I")), int(self.take("Q"))
        lengths[key] = n
        if inner == STRING:
            if n * 8 > len(self.buf) - self.at:  # each string is at least its 8-byte length
                raise self.damaged(f"array {key!r} claims {n:,} strings")
            for _ in range(n):
                self.skip(int(self.take("Q")))
            return None
        if inner not in SCALAR:
            raise self.damaged(f"array {key!r} holds the unsupported value type {inner}")
        size = struct.calcsize("<" + SCALAR[inner])
        if n > KEEP_ARRAY:
            self.skip(n * size)
            return None
        start = self.at
        self.skip(n * size)
        return struct.unpack_from(f"<{n}{SCALAR[inner]}", self.buf, start)


def data_bytes(kind: int, dims: tuple[int, ...], r: Reader) -> int:
    """How many bytes a tensor of ggml type `kind` and these dims holds (gguf's table of block
    sizes: a quantized type stores blocks of values)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise r.damaged(f"a tensor of unknown type {kind}") from None
    return math.prod(dims) // block * size


def read(path: str) -> GGUFMetadata:
    """The header of the GGUF file at `path` (its keys and tensor shapes); ModelLoadError when
    it is not a GGUF or ends early."""
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:  # ValueError: an empty file cannot be mapped
        raise ModelLoadError(f"cannot read the GGUF file {path!r}: {e}") from None
    try:
        r = Reader(buf, path)
        if bytes(buf[:4]) != MAGIC:
            raise ModelLoadError(f"{path!r} is not a GGUF file (it does not start with "
                                 f"{MAGIC!r})")
        r.skip(4)
        version = int(r.take("I"))
        if version not in (2, 3):
            raise r.damaged(f"GGUF version {version} (fptrace reads versions 2 and 3)")
        n_tensors, n_kv = int(r.take("Q")), int(r.take("Q"))
        values: dict[str, Any] = {}
        lengths: dict[str, int] = {}
        for _ in range(n_kv):
            key = r.string()
            values[key] = r.value(int(r.take("I")), key, lengths)
        shapes: dict[str, tuple[int, ...]] = {}
        extents: list[tuple[str, int, int]] = []  # (tensor, element type, data offset)
        for _ in range(n_tensors):
            name = r.string()
            n_dims = int(r.take("I"))
            if n_dims > 8:
                raise r.damaged(f"tensor {name!r} has {n_dims} dimensions")
            shapes[name] = tuple(int(r.take("Q")) for _ in range(n_dims))
            extents.append((name, int(r.take("I")), int(r.take("Q"))))
        alignment = values.get("general.alignment", 32)
        if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1:
            raise r.damaged(f"general.alignment is {shown(alignment)}")
        data = -(-r.at // alignment) * alignment
        for name, kind, offset in extents:
            end = data + offset + data_bytes(kind, shapes[name], r)
            if end > len(buf):
                raise ModelLoadError(
                    f"the GGUF file {path!r} is truncated: tensor {name!r} ends at byte {end:,} "
                    f"but the file has {len(buf):,} (an interrupted download or copy?)")
        return GGUFMetadata(path=path, values=values, array_lengths=lengths, shapes=shapes)
    finally:
        buf.close()


def shown(value: object) -> str:
    """A value as a message states it (a float32 epsilon as 1e-05, not 9.99999974e-06)."""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, tuple):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return repr(value) if isinstance(value, str) else str(value)


def per_block(value: Any) -> tuple[Any, ...] | None:
    """A hyperparameter as its values (one for a scalar, one per block for an array)."""
    if value is None:
        return None
    return value if isinstance(value, tuple) else (value,)


def problem(meta: GGUFMetadata) -> str | None:
    """The first hyperparameter llama.cpp or transformers cannot run (llama.cpp would abort on
    some), as `key is value: why`, or None."""
    arch = meta.architecture
    if arch is None:
        return "general.architecture is missing"

    def key(name: str) -> str:
        return f"{arch}.{name}"

    def count(name: str, least: int, most: int | None = None) -> str | None:
        value = meta.hparam(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{key(name)} is {shown(value)}: expected a whole number"
        if value < least or (most is not None and value > most):
            bound = f"from {least} to {most}" if most is not None else f"at least {least}"
            return f"{key(name)} is {value}: it must be {bound}"
        return None

    found = (count("block_count", 1, MAX_LAYERS) or count("context_length", 1)
             or count("embedding_length", 1) or count("vocab_size", 1))
    if found:
        return found
    for name, value in sorted(meta.values.items()):
        if not name.startswith(arch + "."):
            continue
        if name.endswith("epsilon"):
            for v in per_block(value) or ():
                if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    return f"{name} is {shown(v)}: an epsilon must be finite and not negative"
        if name.endswith("rope.freq_base") and (not isinstance(value, (int, float))
                                                or not math.isfinite(value) or value <= 0):
            return f"{name} is {shown(value)}: the RoPE base must be finite and positive"
    heads = per_block(meta.hparam("attention.head_count"))
    kv = per_block(meta.hparam("attention.head_count_kv"))
    for name, values in (("attention.head_count", heads), ("attention.head_count_kv", kv)):
        if values is None:
            continue
        if any(isinstance(v, (bool, float)) or not isinstance(v, int) or v < 0 for v in values):
            return (f"{key(name)} is {shown(values if len(values) > 1 else values[0])}: "
                    "expected whole numbers of heads")
        if len(values) == 1 and values[0] < 1:
            return f"{key(name)} is {values[0]}: a model has at least 1 head"
        if not any(values):
            return f"{key(name)} is 0 in every block: a model has at least 1 head"
    if heads and kv:
        if len(heads) > 1 and len(kv) > 1 and len(heads) != len(kv):
            return (f"{key('attention.head_count')} has {len(heads)} values but "
                    f"{key('attention.head_count_kv')} {len(kv)}")
        n = max(len(heads), len(kv))
        for i in range(n):
            h, k = heads[i % len(heads)], kv[i % len(kv)]
            if h and k and h % k:
                where = f" (block {i})" if n > 1 else ""
                return (f"{key('attention.head_count')} is {h} and "
                        f"{key('attention.head_count_kv')} {k}{where}: the query heads must "
                        "be a whole multiple of the key/value heads")
    d = meta.hparam("embedding_length")
    if heads and len(heads) == 1 and isinstance(d, int) and meta.hparam(
            "attention.key_length") is None and d % heads[0]:
        return (f"{key('embedding_length')} is {d} and {key('attention.head_count')} "
                f"{heads[0]}: the width must divide into the heads")
    embed = meta.shapes.get("token_embd.weight")
    if embed is not None and len(embed) == 2:
        if isinstance(d, int) and embed[0] != d:
            return (f"{key('embedding_length')} is {d} but token_embd.weight is "
                    f"{embed[0]} wide")
        vocab = meta.hparam("vocab_size")
        if isinstance(vocab, int) and embed[1] != vocab:
            return (f"{key('vocab_size')} is {vocab} but token_embd.weight has {embed[1]} rows")
    return None


def check(path: str) -> GGUFMetadata:
    """The metadata of the GGUF file at `path`, or ModelLoadError (one line) when a
    hyperparameter is one that llama.cpp or transformers cannot run."""
    meta = read(path)
    found = problem(meta)
    if found is not None:
        raise ModelLoadError(f"the GGUF file {path!r} cannot be run: {found} (the file is "
                             "damaged or was edited)")
    return meta


def config_overrides(meta: GGUFMetadata) -> dict[str, Any]:
    """What transformers' GGUF loader would leave at its config's default though the file, or
    its architecture, states it (the family's `gguf_config`): config attribute -> value, for
    from_pretrained. A key the file lacks is left to the loader."""
    from fptrace.families import gguf_config_for

    out: dict[str, Any] = {}
    for attribute, source in gguf_config_for(meta.architecture or "", meta.experts).items():
        value = meta.hparam(source) if isinstance(source, str) else source
        if value is not None:
            out[attribute] = value
    return out


# GGUF architectures that llama.cpp runs and transformers' GGUF loader lists but cannot load as
# llama.cpp's converter writes them, and fptrace's reader does not read: why. None now: gpt-oss
# was one (the loader fails on its YaRN keys and, without them, leaves the experts and the sinks
# unloaded; tests/test_llamacpp_families.py holds that gap) and fptrace reads it itself
# (families/gpt_oss.py's GGUF_WEIGHTS), which sources and the GGUF cache ask first
LOADER_GAPS: dict[str, str] = {}


def _version() -> str:
    from importlib import metadata

    try:
        return f"transformers {metadata.version('transformers')}"
    except metadata.PackageNotFoundError:
        return "transformers"


NEEDS_LOADER = ("; fptrace reads a file of this architecture through it, --engine llama.cpp "
                "too (for the token texts and the logit lens)")


def loader_gap(meta: GGUFMetadata) -> str | None:
    """Why transformers' GGUF loader cannot load this file though it lists its architecture
    (LOADER_GAPS), asked before the loader runs: a loader that reads the file without some of
    its weights leaves them at random values with a warning only; None where no gap is known."""
    arch = meta.architecture
    if arch not in LOADER_GAPS:
        return None
    return (f"{_version()}'s GGUF loader cannot load a {arch} file as llama.cpp's converter "
            f"writes it: {LOADER_GAPS[arch]}{NEEDS_LOADER}")


def unreadable(arch: str | None, error: BaseException) -> str:
    """Why transformers' GGUF loader failed on a file of GGUF architecture `arch` (with
    `error`), for the one line that refuses the file: the architecture it does not read (its
    own words kept), else the error itself."""
    raw = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"[:300]
    if isinstance(error, ValueError) and "is not supported" in str(error):
        return (f"{_version()}'s GGUF loader reads no {arch!r} file ({raw}){NEEDS_LOADER}")
    return raw


__all__ = ["LOADER_GAPS", "MAX_LAYERS", "NEEDS_LOADER", "GGUFMetadata", "check",
           "config_overrides", "loader_gap", "problem", "read", "unreadable"]
