"""A Q4_K_M GGUF made offline from another GGUF, with llama.cpp's own quantizer.

The pinned build does not export `llama_model_quantize` (llama-quantize's entry point), but it
exports ggml's `ggml_quantize_chunk`, the function llama-quantize calls on each tensor. So the
file is made as llama-quantize makes it, in two parts: each tensor's type is chosen by the rule
llama.cpp's llama-quant.cpp applies for Q4_K_M (read from its source, written anew here), and
its float32 values (the source file's tensors dequantized by the gguf package) are quantized by
ggml; the gguf package writes the file, with the source's metadata and the file type Q4_K_M.

The rule: Q4_K by default; Q6_K for the LM head (or the token embedding when the head is tied to
it) and, in the blocks where llama.cpp spends more bits (the first and last eighth and every
third between), for attn_v and ffn_down; 1-D tensors (the norms) stay float32. A row whose length
is not a multiple of 256 cannot hold K-quant blocks and falls back as llama.cpp falls back
(Q4_K to Q5_0, Q6_K to Q8_0).
"""

from __future__ import annotations

import ctypes as C
import os

import numpy as np

from fptrace.errors import BadInput

LLAMA_FTYPE_MOSTLY_Q4_K_M = 15
QK_K = 256
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def more_bits(layer: int, n_layer: int) -> bool:
    """The blocks where llama.cpp's Q4_K_M keeps attn_v and ffn_down in Q6_K."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or \
        (layer - n_layer // 8) % 3 == 2


def q4_k_m_type(name: str, shape: tuple[int, ...], n_layer: int, has_output: bool) -> str:
    """The GGUF type llama.cpp's Q4_K_M gives the tensor `name` of numpy shape `shape`."""
    if len(shape) < 2:
        return "F32"
    head = name == "output.weight" or (not has_output and name == "token_embd.weight")
    more = name.startswith("blk.") and name.endswith((".attn_v.weight", ".ffn_down.weight")) \
        and more_bits(int(name.split(".")[1]), n_layer)
    kind = "Q6_K" if head or more else "Q4_K"
    if shape[-1] % QK_K:
        kind = FALLBACK[kind]
    return kind


def quantize_rows(lib: C.CDLL, kind: str, x: np.ndarray) -> np.ndarray:
    """x (rows, n) float32 quantized by ggml to `kind`: the raw bytes, (rows, bytes per row)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    qtype = GGMLQuantizationType[kind]
    block, size = GGML_QUANT_SIZES[qtype]
    rows, n = x.shape
    if n % block:  # ggml would write past the buffer (and past a row's end)
        raise BadInput(f"a row of {n} values cannot be cut into {kind}'s blocks of {block}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((rows, n // block * size), dtype=np.uint8)
    written = lib.ggml_quantize_chunk(int(qtype), x.ctypes.data, out.ctypes.data, 0, rows, n,
                                      None)
    if written != out.nbytes:
        raise RuntimeError(f"ggml_quantize_chunk wrote {written} bytes for {kind}, not "
                           f"{out.nbytes}")
    return out


def write_q4_k_m(src: str, dst: str) -> dict[str, str]:
    """Write `dst`, the GGUF `src` requantized to Q4_K_M by llama.cpp's quantizer; returns each
    tensor's new type."""
    return requantize(src, dst, q4_k_m_type, LLAMA_FTYPE_MOSTLY_Q4_K_M, "Q4_K_M")


def one_type(kind: str):
    """The rule that gives every 2-D tensor `kind` (a type of blocks of 32: Q4_0, Q4_1, Q5_0,
    Q8_0, ...), as llama-quantize with that type does, but for the routers of a mixture of
    experts (`ffn_gate_inp`), which it keeps in float32; 1-D tensors stay float32."""

    def type_of(name: str, shape: tuple[int, ...], n_layer: int, has_output: bool) -> str:
        if len(shape) < 2 or ".ffn_gate_inp" in name:
            return "F32"
        return kind

    return type_of


def requantize(src: str, dst: str, type_of, file_type: int, label: str) -> dict[str, str]:
    """Write `dst`, the GGUF `src` with each tensor quantized by ggml to the type
    `type_of(name, numpy shape, n_layer, has_output)` gives it (general.file_type: `file_type`);
    returns each tensor's new type."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    from fptrace.engines.llamacpp.binding import load

    if os.path.exists(dst):
        raise BadInput(f"{dst} exists; give a new path for the {label} file")
    lib = load().lib
    reader = GGUFReader(src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    n_layer = int(reader.fields[f"{arch}.block_count"].contents())
    names = {t.name for t in reader.tensors}
    writer = GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture",
                                                             "general.file_type"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    writer.add_file_type(file_type)
    types = {}
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type).astype(np.float32)
        kind = type_of(t.name, values.shape, n_layer, "output.weight" in names)
        types[t.name] = kind
        if kind == "F32":
            writer.add_tensor(t.name, values)
            continue
        raw = quantize_rows(lib, kind, values.reshape(-1, values.shape[-1]))
        writer.add_tensor(t.name, raw.reshape(*values.shape[:-1], raw.shape[-1]),
                          raw_dtype=GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return types


__all__ = ["more_bits", "one_type", "q4_k_m_type", "quantize_rows", "requantize",
           "write_q4_k_m"]
