"""One forward pass of a GGUF in llama.cpp, every graph tensor captured by name.

llama.cpp builds a compute graph per batch and, when the context has an eval callback, asks it
about every node before computing it (`ask`) and hands over the node once computed. The nodes
carry the names llama.cpp's model code gives them, with the block as a suffix (`Qcur-3`,
`l_out-29`); a name given twice (Qcur after the projection, the reshape and RoPE) is kept at its
last node, the one the rest of the graph reads. ggml orders dimensions fastest first (ne[0]), so
a tensor comes out with its numpy shape reversed: `l_out-k` is (T, d), `Qcur-k` (T, nh, hd).

The batch asks for an output at every position, so llama.cpp keeps every row to the end (it
drops the rows nobody reads before the last block otherwise) and the logits are (T, V).
"""

from __future__ import annotations

import ctypes as C
import os
import re
import time
from dataclasses import dataclass, field

import numpy as np

from fptrace.engines.llamacpp import binding as B
from fptrace.errors import BadInput, FptraceError, ModelLoadError, TraceFailed, param
from fptrace.models.gguf_metadata import GGUFMetadata
from fptrace.models.prompts import too_long

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class EngineOptions:
    """The llama.cpp settings that change its numbers."""

    flash_attn: str = "auto"  # auto | on | off (llama.cpp's CPU default is auto, i.e. on)
    cache_type: str = "f16"   # the K/V cache's element type: f16 (default), f32, bf16
    threads: int = field(default_factory=lambda: min(4, os.cpu_count() or 1))


@dataclass(frozen=True)
class LlamaCppPass:
    """What one captured llama.cpp pass returns (float32 numpy arrays, batch of one)."""

    path: str
    prompt: str
    architecture: str
    n_layer: int
    ids: tuple[int, ...]
    pieces: tuple[str, ...]
    tensors: dict[str, np.ndarray] = field(repr=False)  # graph name -> array, numpy order
    logits: np.ndarray = field(repr=False)              # (T, V), llama.cpp's own output
    options: EngineOptions = field(default_factory=EngineOptions)
    skipped: tuple[str, ...] = ()  # names seen but not copied (quantized element types)
    own_ids: tuple[int, ...] | None = None  # llama.cpp's tokenization, when ids were given
    decode_seconds: float = 0.0  # wall time of llama_decode (the pass, with its captures)
    # the file states routed experts (`{architecture}.expert_count` above 0: Mixtral's `llama`)
    experts: bool = False

    def get(self, name: str, layer: int | None = None) -> np.ndarray | None:
        return self.tensors.get(name if layer is None else f"{name}-{layer}")


def check_gguf(path: str) -> GGUFMetadata:
    """The file's metadata, checked (models/gguf_metadata.py: llama.cpp aborts the process on
    some values instead of refusing them); BadInput unless `path` is a readable file that
    starts as a GGUF does."""
    from fptrace.models.gguf_metadata import check

    if not os.path.isfile(path):
        raise BadInput(f"{param('engine')} llama.cpp needs a .gguf file; {path!r} is not a file")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise BadInput(f"{param('engine')} llama.cpp needs a GGUF file; {path!r} does not start "
                       f"with "
                       f"the GGUF magic (it starts with {head!r})")
    return check(path)


# llama.cpp's vocabulary loader (llama-vocab.cpp) gives these tokens their attributes, looked up
# by their text, in any file whose general.name says Phi-3, whatever its architecture; a
# vocabulary without one of them fails there with std::unordered_map::at's `_Map_base::at`
PHI3_TOKENS = ("<unk>", "<s>", "</s>", "<|endoftext|>")


def load_failure(path: str, architecture: str | None, errors: list[str],
                 name: str | None = None) -> FptraceError:
    """Why llama.cpp returned no model, from the error messages it logged: an architecture this
    build does not know, or the reason it gave for one it does (`name`: the file's
    general.name, which explains one of them)."""
    build = f"llama.cpp ({B.PACKAGE} {B.PINNED_VERSION})"
    if any("unknown model architecture" in e for e in errors):
        return BadInput(f"{build} cannot load {path!r}: architecture {architecture!r} is "
                        "unknown to this build")
    said = [e.split("error loading model: ")[-1].rstrip(".") for e in errors
            if "failed to load model" not in e]
    why = f": {said[-1]}" if said else " (it gave no reason)"
    if said and "_Map_base::at" in said[-1] and name and \
            any(p in name.lower() for p in ("phi3", "phi-3")):
        why += (f" (its general.name, {name!r}, makes llama.cpp look up Phi-3's special tokens "
                f"{', '.join(PHI3_TOKENS)} by their text, and its vocabulary lacks one)")
    return ModelLoadError(f"{build} failed to load {path!r} (architecture {architecture!r}, "
                          f"which this build knows){why}")


def tokenize(lib: C.CDLL, vocab: int, text: str) -> list[int]:
    raw = text.encode("utf-8")
    n_max = len(raw) + 8
    buf = (C.c_int32 * n_max)()
    n = lib.llama_tokenize(vocab, raw, len(raw), buf, n_max, True, False)
    if n < 0:
        buf = (C.c_int32 * -n)()
        n = lib.llama_tokenize(vocab, raw, len(raw), buf, -n, True, False)
    return list(buf[:n])


def piece(lib: C.CDLL, vocab: int, token: int) -> str:
    buf = C.create_string_buffer(256)
    n = lib.llama_token_to_piece(vocab, token, buf, 256, 0, True)
    return buf.raw[:max(n, 0)].decode("utf-8", "replace")


def copy_out(lib: C.CDLL, t: int) -> np.ndarray | None:
    """The tensor's values as float32 in numpy order (reversed ne), int32 for an I32 tensor
    (the experts an MoE router chose), or None for another type."""
    head = B.Tensor.from_address(t)
    dims = [int(n) for n in head.ne]
    strides = [int(s) for s in head.nb]
    item = {B.GGML_TYPE_F32: 4, B.GGML_TYPE_F16: 2, B.GGML_TYPE_BF16: 2,
            B.GGML_TYPE_I32: 4}.get(head.type)
    if item is None or strides[0] != item:
        return None
    span = int(lib.ggml_nbytes(t))
    raw = np.empty(span, dtype=np.uint8)
    lib.ggml_backend_tensor_get(t, raw.ctypes.data, 0, span)
    dtype = {B.GGML_TYPE_F32: np.float32, B.GGML_TYPE_F16: np.float16,
             B.GGML_TYPE_BF16: np.uint16, B.GGML_TYPE_I32: np.int32}[head.type]
    # the bytes as elements; the strides (in bytes, fastest dimension last) give the layout
    view = np.lib.stride_tricks.as_strided(raw[: span - span % item].view(dtype),
                                           shape=tuple(reversed(dims)),
                                           strides=tuple(reversed(strides)))
    if head.type == B.GGML_TYPE_BF16:
        return (view.astype(np.uint32) << 16).view(np.float32).copy()
    if head.type == B.GGML_TYPE_I32:
        return np.ascontiguousarray(view, dtype=np.int32)
    return np.ascontiguousarray(view, dtype=np.float32)


# how many of the last unnamed nodes of the stream's width are kept for `operands`
RECENT = 16
BLOCK_SUFFIX = re.compile(r"-\d+$")


class Capture:
    """The eval callback: says yes to every node whose base name is wanted and copies it.

    operands: name -> (named base, i, ...): where an architecture's graph leaves a point unnamed
    (Qwen2's attention output, which its graph adds to the stream as ffn_inp's operand 0) or
    names it without its block (Gemma 2's `ffn_post_norm`), the point is read as operand i of
    the named node of the same block and stored under `name`; more indices follow operands of
    operands (Phi-3's attention output is operand 0 of l_out's unnamed operand 0).
    The operand cannot be read once its consumer is computed (ggml may compute an add in place,
    over its operand), so every unnamed node of the stream's width (`width`) is copied when it
    is computed and the operand is found among the recent ones by its address.
    A name a block gives two nodes is the later node's, but the earlier one's for the names in
    `first` (GPT-NeoX's `ffn_out`: the MLP's output, then the same plus the block's input)."""

    def __init__(self, lib: C.CDLL, wanted: frozenset[str] | None,
                 operands: dict[str, tuple] | None = None, width: int | None = None,
                 first: tuple[str, ...] = ()):
        self.lib, self.wanted = lib, wanted
        self.first = frozenset(first)
        self.tensors: dict[str, np.ndarray] = {}
        self.skipped: set[str] = set()
        self.error: BaseException | None = None
        self.consumers: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
        for point, (base, *path) in (operands or {}).items():
            self.consumers.setdefault(base, []).append((point, tuple(path)))
        self.width = width
        self.recent: dict[int, np.ndarray] = {}
        self.callback = B.EVAL_CALLBACK(self.__call__)

    def want(self, name: str) -> bool:
        return self.wanted is None or name.rsplit("-", 1)[0] in self.wanted

    def unnamed(self, t: int, name: str) -> bool:
        """A node of the stream's width that no block's name tells apart (ggml's `node_N`, or
        a name given without the block's suffix, as Gemma 2's `ffn_post_norm`), while some
        operand is looked for."""
        return bool(self.consumers) and (name.startswith("node_") or not BLOCK_SUFFIX.search(
            name)) and B.Tensor.from_address(t).ne[0] == self.width

    def __call__(self, t, ask, user_data):
        try:
            name = self.lib.ggml_get_name(t).decode("utf-8", "replace")
            if ask:
                return self.want(name) or self.unnamed(t, name)
            unnamed, wanted = self.unnamed(t, name), self.want(name)
            arr = copy_out(self.lib, t) if unnamed or wanted else None
            if unnamed and arr is not None:
                self.recent[t] = arr
                while len(self.recent) > RECENT:
                    del self.recent[next(iter(self.recent))]
            if wanted:
                if arr is None:
                    self.skipped.add(name)
                elif name not in self.tensors or name.rsplit("-", 1)[0] not in self.first:
                    self.tensors[name] = arr
                self.operand_of(t, name)
            return True
        except BaseException as exc:  # noqa: BLE001 - never let Python unwind through C
            self.error = self.error or exc
            return True

    def operand_of(self, t: int, name: str) -> None:
        """Store the operand `name`'s node carries for a point its graph leaves unnamed."""
        base, _, layer = name.rpartition("-")
        for point, path in self.consumers.get(base, ()):
            if f"{point}-{layer}" in self.tensors:  # named in this graph after all
                continue
            src: int | None = t
            for i in path:  # operand of operand: each one an unnamed node, named node_N
                if src is None:
                    break
                src = B.source(src, i, name if src == t else
                               self.lib.ggml_get_name(src).decode("utf-8", "replace"))
            if src in self.recent:
                self.tensors[f"{point}-{layer}"] = self.recent[src]


def make_batch(ids: list[int]) -> tuple[B.Batch, list]:
    """A batch of one sequence with an output at every position (keep-alive list returned)."""
    n = len(ids)
    tokens = (C.c_int32 * n)(*ids)
    pos = (C.c_int32 * n)(*range(n))
    n_seq = (C.c_int32 * n)(*([1] * n))
    seq0 = (C.c_int32 * 1)(0)
    seq_ids = (C.POINTER(C.c_int32) * n)(*([C.cast(seq0, C.POINTER(C.c_int32))] * n))
    outputs = (C.c_int8 * n)(*([1] * n))
    batch = B.Batch(n, tokens, None, pos, n_seq, seq_ids, outputs)
    return batch, [tokens, pos, n_seq, seq0, seq_ids, outputs]


def run_pass(path: str, prompt: str, options: EngineOptions | None = None,
             ids: list[int] | None = None, wanted: frozenset[str] | None = None,
             capture: bool = True,
             operands: dict[str, tuple] | None = None,
             meta: GGUFMetadata | None = None, first: tuple[str, ...] = ()) -> LlamaCppPass:
    """Load `path` in llama.cpp, tokenize `prompt` with its tokenizer (or take `ids`), decode
    once with every wanted graph tensor captured (all of them when `wanted` is None), and the
    `operands` the graph leaves unnamed (Capture); first: names a block gives two nodes,
    the first of which is kept (Capture). meta: the file's checked metadata, where the
    caller has read it already (check_gguf)."""
    options = options or EngineOptions()
    if options.flash_attn not in B.FLASH_ATTN:
        raise BadInput(f"flash attention {options.flash_attn!r}: expected one of "
                       f"{', '.join(B.FLASH_ATTN)}")
    if options.cache_type not in B.CACHE_TYPES:
        raise BadInput(f"K/V cache type {options.cache_type!r}: expected one of "
                       f"{', '.join(B.CACHE_TYPES)}")
    meta = meta or check_gguf(path)
    lib = B.load().lib
    B.take_errors()
    model = lib.llama_model_load_from_file(path.encode(), lib.llama_model_default_params())
    if not model:
        raise load_failure(path, meta.architecture, B.take_errors(),
                           meta.values.get("general.name"))
    try:
        vocab = lib.llama_model_get_vocab(model)
        own = tuple(tokenize(lib, vocab, prompt)) if prompt else None
        ids = list(ids) if ids is not None else list(own or ())
        if not ids:
            raise BadInput("the prompt has no tokens in llama.cpp's tokenizer")
        limit = meta.context_length
        if limit is not None and len(ids) > limit:  # before the context: its buffers are the cost
            raise too_long(len(ids), limit, os.path.basename(path), truncate=False)
        n_vocab = lib.llama_vocab_n_tokens(vocab)
        bad = [i for i in ids if not 0 <= i < n_vocab]
        if bad:
            raise BadInput(f"token id {bad[0]} is outside llama.cpp's vocabulary of {n_vocab}")
        width = meta.hparam("embedding_length")
        grab = Capture(lib, wanted, operands, int(width) if width else None, first) \
            if capture else None
        params = lib.llama_context_default_params()
        size = max(len(ids), 8)
        params.n_ctx = params.n_batch = params.n_ubatch = size
        params.n_threads = params.n_threads_batch = options.threads
        params.flash_attn_type = B.FLASH_ATTN[options.flash_attn]
        params.type_k = params.type_v = B.CACHE_TYPES[options.cache_type]
        if grab is not None:
            params.cb_eval = C.cast(grab.callback, C.c_void_p)
        ctx = lib.llama_init_from_model(model, params)
        if not ctx:
            raise TraceFailed(f"llama.cpp could not make a context for {path!r} "
                              f"({len(ids)} tokens, flash attention {options.flash_attn}, "
                              f"cache {options.cache_type})")
        try:
            batch, keep = make_batch(ids)
            start = time.perf_counter()
            rc = lib.llama_decode(ctx, batch)
            seconds = time.perf_counter() - start
            if rc != 0:
                raise TraceFailed(f"llama_decode returned {rc} on {path!r} ({len(ids)} tokens)")
            if grab is not None and grab.error is not None:
                raise TraceFailed(f"copying llama.cpp's tensors failed: {grab.error}")
            logits = np.stack([np.ctypeslib.as_array(lib.llama_get_logits_ith(ctx, i),
                                                     shape=(n_vocab,)).copy()
                               for i in range(len(ids))])
            del keep
        finally:
            lib.llama_free(ctx)
        arch = C.create_string_buffer(128)
        lib.llama_model_meta_val_str(model, b"general.architecture", arch, 128)
        experts = C.create_string_buffer(32)
        lib.llama_model_meta_val_str(model, arch.value + b".expert_count", experts, 32)
        return LlamaCppPass(
            path=path, prompt=prompt, own_ids=own, decode_seconds=seconds,
            architecture=arch.value.decode("utf-8", "replace"),
            experts=_count(experts.value) > 0,
            n_layer=int(lib.llama_model_n_layer(model)), ids=tuple(ids),
            pieces=tuple(piece(lib, vocab, i) for i in ids),
            tensors=dict(grab.tensors) if grab else {}, logits=logits.astype(np.float32),
            options=options, skipped=tuple(sorted(grab.skipped)) if grab else ())
    except FptraceError:
        raise
    except OSError as exc:
        raise ModelLoadError(f"llama.cpp failed on {path!r}: {exc}") from None
    finally:
        lib.llama_model_free(model)


def _count(raw: bytes) -> int:
    """A count llama.cpp prints as ASCII decimal digits (its metadata as a string); 0 where it
    holds anything else (no such key: an empty string)."""
    try:
        return int(raw.decode("ascii"))
    except ValueError:  # UnicodeDecodeError included
        return 0


__all__ = ["EngineOptions", "LlamaCppPass", "check_gguf", "copy_out", "load_failure", "run_pass"]
