"""The pinned llama.cpp, reached through ctypes: the structures of its C API that fptrace uses,
declared for this one build, and the check that the library loaded is that build.

The build is the CPU wheel `xllamacpp==2026.10.11549` (MIT), which ships llama.cpp and ggml
statically linked into one shared library and exports their C API. That build does not record
its llama.cpp commit (`LLAMA_COMMIT` is "unknown", the build number 0), so the layout below was
derived from llama.h of ggml-org/llama.cpp as of commit 0011438e (the fields `n_rs_seq`,
`n_outputs_max`, `ctx_type` in `llama_context_params`, `cb_eval` at byte 88) and checked against
what this library's `llama_context_default_params()` returns: it holds one more 32-bit field
after `n_outputs_max` (default 1), and the whole structure is 168 bytes (measured). The fields
fptrace never writes are kept as opaque bytes copied from the defaults. `check()` compares
every declared default before anything is written; another build is refused with one line.
"""

from __future__ import annotations

import collections
import ctypes as C
import functools
import math
import os
from dataclasses import dataclass

from fptrace.errors import BadInput, param

PACKAGE = "xllamacpp"
PINNED_VERSION = "2026.10.11549"
INSTALL_HINT = ('install the extra: pip install "fptrace[llamacpp]" '
                f"(the CPU build {PACKAGE}=={PINNED_VERSION})")

# ggml's element types that a captured tensor can have (enum ggml_type)
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_BF16 = 30
GGML_TYPE_I32 = 26
GGML_MAX_DIMS = 4

# enum llama_flash_attn_type
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
# the K/V cache types a user can ask for (enum ggml_type)
CACHE_TYPES = {"f32": GGML_TYPE_F32, "f16": GGML_TYPE_F16, "bf16": GGML_TYPE_BF16}

# bool (*ggml_backend_sched_eval_callback)(struct ggml_tensor * t, bool ask, void * user_data)
EVAL_CALLBACK = C.CFUNCTYPE(C.c_bool, C.c_void_p, C.c_bool, C.c_void_p)
# void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data)
LOG_CALLBACK = C.CFUNCTYPE(None, C.c_int, C.c_char_p, C.c_void_p)


class ContextParams(C.Structure):
    """struct llama_context_params of the pinned build (168 bytes)."""

    _fields_ = [
        ("n_ctx", C.c_uint32),
        ("n_batch", C.c_uint32),
        ("n_ubatch", C.c_uint32),
        ("n_seq_max", C.c_uint32),
        ("n_rs_seq", C.c_uint32),
        ("n_outputs_max", C.c_uint32),
        ("unnamed_u32", C.c_uint32),  # present in this build only; default 1; never written
        ("n_threads", C.c_int32),
        ("n_threads_batch", C.c_int32),
        ("ctx_type", C.c_int),
        ("rope_scaling_type", C.c_int),
        ("pooling_type", C.c_int),
        ("attention_type", C.c_int),
        ("flash_attn_type", C.c_int),
        ("rope_freq_base", C.c_float),
        ("rope_freq_scale", C.c_float),
        ("yarn_ext_factor", C.c_float),
        ("yarn_attn_factor", C.c_float),
        ("yarn_beta_fast", C.c_float),
        ("yarn_beta_slow", C.c_float),
        ("yarn_orig_ctx", C.c_uint32),
        ("defrag_thold", C.c_float),
        ("cb_eval", C.c_void_p),
        ("cb_eval_user_data", C.c_void_p),
        ("type_k", C.c_int),
        ("type_v", C.c_int),
        ("abort_callback", C.c_void_p),
        ("abort_callback_data", C.c_void_p),
        # the booleans, the sampler configuration and this build's additions: copied as they are
        ("rest", C.c_uint64 * 5),
    ]


class ModelParams(C.Structure):
    """struct llama_model_params of the pinned build (80 bytes), passed on as its defaults."""

    _fields_ = [
        ("devices", C.c_void_p),
        ("tensor_buft_overrides", C.c_void_p),
        ("n_gpu_layers", C.c_int32),
        ("split_mode", C.c_int),
        ("main_gpu", C.c_int32),
        ("unnamed_u32", C.c_uint32),  # present in this build only
        ("rest", C.c_uint64 * 6),     # tensor_split, callbacks, kv_overrides, booleans
    ]


class Batch(C.Structure):
    """struct llama_batch."""

    _fields_ = [
        ("n_tokens", C.c_int32),
        ("token", C.POINTER(C.c_int32)),
        ("embd", C.POINTER(C.c_float)),
        ("pos", C.POINTER(C.c_int32)),
        ("n_seq_id", C.POINTER(C.c_int32)),
        ("seq_id", C.POINTER(C.POINTER(C.c_int32))),
        ("logits", C.POINTER(C.c_int8)),
    ]


class Tensor(C.Structure):
    """The head of struct ggml_tensor: its type, shape and strides (ne[0] is the fastest
    dimension; nb are byte strides). The name is read through ggml_get_name."""

    _fields_ = [
        ("type", C.c_int),
        ("buffer", C.c_void_p),
        ("ne", C.c_int64 * GGML_MAX_DIMS),
        ("nb", C.c_size_t * GGML_MAX_DIMS),
    ]


# struct ggml_tensor past its head: after op (80) and op_params (64 bytes) and flags, the
# GGML_MAX_SRC operand pointers; the name, at NAME_OFFSET, checks the layout (source())
SRC_OFFSET = 152
GGML_MAX_SRC = 10
NAME_OFFSET = 256


def source(t: int, i: int, name: str) -> int | None:
    """The address of operand i of the ggml_tensor at `t` (named `name`, as ggml_get_name
    says), or None; TraceFailed when the name is not where the pinned layout puts it (another
    ggml's operands would be read wrong)."""
    from fptrace.errors import TraceFailed

    if not 0 <= i < GGML_MAX_SRC:
        raise ValueError(f"ggml tensors have {GGML_MAX_SRC} operands; asked for {i}")
    if C.string_at(t + NAME_OFFSET).decode("utf-8", "replace") != name:
        raise TraceFailed("the ggml_tensor layout differs from the pinned build's: cannot "
                          "read an operand")
    return C.c_void_p.from_address(t + SRC_OFFSET + 8 * i).value


# the layout facts this module relies on, checked at start (the issue measured cb_eval at 88)
OFFSETS = {"cb_eval": 88, "type_k": 104, "flash_attn_type": 52, "n_threads": 28}
SIZES = {ContextParams: 168, ModelParams: 80, Batch: 56}

# what llama_context_default_params() returns in the pinned build, field by field
DEFAULTS = {
    "n_ctx": 512, "n_batch": 2048, "n_ubatch": 512, "n_seq_max": 1, "n_rs_seq": 0,
    "n_outputs_max": 0, "unnamed_u32": 1, "n_threads": 4, "n_threads_batch": 4, "ctx_type": 0,
    "rope_scaling_type": -1, "pooling_type": -1, "attention_type": -1, "flash_attn_type": -1,
    "rope_freq_base": 0.0, "rope_freq_scale": 0.0, "yarn_ext_factor": -1.0,
    "yarn_attn_factor": -1.0, "yarn_beta_fast": -1.0, "yarn_beta_slow": -1.0,
    "yarn_orig_ctx": 0, "defrag_thold": -1.0, "cb_eval": None, "cb_eval_user_data": None,
    "type_k": GGML_TYPE_F16, "type_v": GGML_TYPE_F16, "abort_callback": None,
    "abort_callback_data": None,
}
MODEL_DEFAULTS = {"devices": None, "tensor_buft_overrides": None, "n_gpu_layers": -1}


def layout_problems() -> list[str]:
    """Where the declared structures disagree with the facts they were written from."""
    out = [f"{cls.__name__} is {C.sizeof(cls)} bytes, not {n}"
           for cls, n in SIZES.items() if C.sizeof(cls) != n]
    out += [f"{name} at byte {getattr(ContextParams, name).offset}, not {at}"
            for name, at in OFFSETS.items() if getattr(ContextParams, name).offset != at]
    return out


def default_problems(params: C.Structure, expected: dict) -> list[str]:
    """The fields of `params` whose value is not the pinned build's default."""
    out = []
    for name, want in expected.items():
        got = getattr(params, name)
        same = (got == want) if not isinstance(want, float) else math.isclose(got, want)
        if not same:
            out.append(f"{name}={got!r} (expected {want!r})")
    return out


@dataclass(frozen=True)
class Library:
    """The loaded shared library with the signatures fptrace calls declared."""

    lib: C.CDLL
    path: str
    version: str


def installed_version() -> str | None:
    from importlib import metadata
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return None


def library_path() -> str | None:
    """The shared library the xllamacpp wheel ships, without importing its Python module."""
    from importlib import metadata
    try:
        files = metadata.distribution(PACKAGE).files or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        name = os.path.basename(str(f))
        if name.startswith(PACKAGE) and (".so" in name or name.endswith((".dylib", ".pyd"))):
            path = str(f.locate())
            if os.path.isfile(path):
                return path
    return None


def declare(lib: C.CDLL) -> None:
    """The argument and result types of every function fptrace calls."""
    p, i32, u8p = C.c_void_p, C.c_int32, C.c_char_p
    sig = {
        "llama_backend_init": (None, []),
        "llama_log_set": (None, [LOG_CALLBACK, p]),
        "ggml_log_set": (None, [LOG_CALLBACK, p]),
        "llama_context_default_params": (ContextParams, []),
        "llama_model_default_params": (ModelParams, []),
        "llama_model_load_from_file": (p, [u8p, ModelParams]),
        "llama_model_free": (None, [p]),
        "llama_init_from_model": (p, [p, ContextParams]),
        "llama_free": (None, [p]),
        "llama_model_get_vocab": (p, [p]),
        "llama_model_n_layer": (i32, [p]),
        "llama_model_n_embd": (i32, [p]),
        "llama_vocab_n_tokens": (i32, [p]),
        "llama_vocab_get_add_bos": (C.c_bool, [p]),
        "llama_model_meta_val_str": (i32, [p, u8p, C.c_char_p, C.c_size_t]),
        "llama_tokenize": (i32, [p, u8p, i32, C.POINTER(i32), i32, C.c_bool, C.c_bool]),
        "llama_token_to_piece": (i32, [p, i32, C.c_char_p, i32, i32, C.c_bool]),
        "llama_decode": (i32, [p, Batch]),
        "llama_get_logits_ith": (C.POINTER(C.c_float), [p, i32]),
        "ggml_get_name": (u8p, [p]),
        "ggml_nbytes": (C.c_size_t, [p]),
        "ggml_nelements": (C.c_int64, [p]),
        "ggml_is_contiguous": (C.c_bool, [p]),
        "ggml_backend_tensor_get": (None, [p, p, C.c_size_t, C.c_size_t]),
        "ggml_fp16_to_fp32_row": (None, [p, p, C.c_int64]),
        "ggml_bf16_to_fp32_row": (None, [p, p, C.c_int64]),
        "ggml_quantize_chunk": (C.c_size_t, [C.c_int, p, p, C.c_int64, C.c_int64, C.c_int64,
                                             p]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args


# enum ggml_log_level: the level of llama.cpp's messages that say why a load failed
GGML_LOG_LEVEL_ERROR = 4
# llama.cpp's last error messages (its load messages would fill stderr: they are not shown)
ERRORS: collections.deque[str] = collections.deque(maxlen=16)


@LOG_CALLBACK
def _collect(level, text, user_data):
    if level == GGML_LOG_LEVEL_ERROR and text:
        ERRORS.append(text.decode("utf-8", "replace").strip())


def take_errors() -> list[str]:
    """llama.cpp's error messages since the last call (emptied)."""
    out = list(ERRORS)
    ERRORS.clear()
    return out


@functools.cache
def load() -> Library:
    """The pinned library, checked; BadInput (one line) when it is missing or another build."""
    version = installed_version()
    if version is None:
        raise BadInput(f"{param('engine')} llama.cpp needs the package {PACKAGE}, which is not "
                       f"installed; {INSTALL_HINT}")
    if version != PINNED_VERSION:
        raise BadInput(f"{param('engine')} llama.cpp was written for {PACKAGE}=={PINNED_VERSION}; "
                       f"{version} is installed, whose structures may differ: {INSTALL_HINT}")
    problems = layout_problems()
    path = library_path()
    if path is None:
        raise BadInput(f"{PACKAGE} {version} is installed but its shared library is missing; "
                       f"{INSTALL_HINT}")
    lib = C.CDLL(path)
    declare(lib)
    problems += default_problems(lib.llama_context_default_params(), DEFAULTS)
    problems += default_problems(lib.llama_model_default_params(), MODEL_DEFAULTS)
    if problems:
        raise BadInput(f"the llama.cpp in {path} is not laid out as the build fptrace was "
                       f"written for ({'; '.join(problems[:3])}); {INSTALL_HINT}")
    lib.llama_log_set(_collect, None)
    lib.ggml_log_set(_collect, None)
    lib.llama_backend_init()
    return Library(lib=lib, path=path, version=version)


__all__ = [
    "CACHE_TYPES",
    "DEFAULTS",
    "EVAL_CALLBACK",
    "FLASH_ATTN",
    "PINNED_VERSION",
    "Batch",
    "ContextParams",
    "Library",
    "ModelParams",
    "Tensor",
    "default_problems",
    "layout_problems",
    "load",
    "take_errors",
]
