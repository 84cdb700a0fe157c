"""llama.cpp's CPU numerics, written in torch, so that a transformers pass can reproduce them one
by one (`diff --engine-b llama.cpp --emulate STEPS`).

Each step is one thing ggml's CPU backend does that a float32 transformers pass does not; they
were read from ggml's source (ggml-cpu's `type_traits_cpu`, `quantize_row_q8_0/q8_1/q8_K`, the
`flash_attn_ext_f16_one_chunk` kernel and the `mul_mat`/`soft_max` path) and are written here
anew in torch:

- `kv`: K (after RoPE) and V are stored in the K/V cache in its element type (f16 unless
  `--kv-cache` says otherwise) and read back from it;
- `act-q8`: a matrix product with a quantized weight first quantizes its input row to the
  weight type's `vec_dot_type` (Q4_0, Q5_0, Q8_0, IQ4_NL: Q8_0, blocks of 32 with an f16 scale;
  Q4_1, Q5_1: Q8_1, the same values plus an f16 block sum; the K-quants and IQ4_XS: Q8_K, blocks
  of 256 with an f32 scale); an f16 or bf16 weight rounds its input to f16 or bf16;
- `attn`: the attention kernel. With flash attention on (the CPU default) and fewer than 64
  query rows, Q is rounded to the cache type, the scores are taken in f32, and the softmax runs
  online, key by key, with the weighted sum of V kept in an f16 accumulator that is rounded at
  every step; with flash attention off, Q is rounded to the cache type (the product with the
  f16 K casts it) and the softmax's probabilities to f16 (the product with V casts them).

Everything here is pure: functions of tensors, and the parsing of the step list. Attaching them
to a model is the diff command's business.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from fptrace.errors import BadInput

# the steps, in the order a ladder adds them, with what each reproduces
STEPS = {
    "kv": "K (after RoPE) and V rounded to the K/V cache type (--kv-cache, f16 by default)",
    "act-q8": "the input of each product with a quantized weight quantized to the weight "
              "type's 8-bit blocks (Q8_0, Q8_1 or Q8_K), f16/bf16 for f16/bf16 weights",
    "norm": "RMSNorm as ggml computes it: the sum of squares in double, 1/sqrt in float",
    "attn": "llama.cpp's attention kernel: Q in the cache type, and with flash attention an "
            "online softmax whose f16 accumulator of V is rounded key by key (without it, the "
            "probabilities rounded to f16)",
}
ALL = "all"

# ggml-cpu's type_traits_cpu[type].vec_dot_type, for the weight types a GGUF holds
VEC_DOT = {
    "Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "IQ4_NL": "Q8_0",
    "Q4_1": "Q8_1", "Q5_1": "Q8_1",
    "Q2_K": "Q8_K", "Q3_K": "Q8_K", "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K",
    "IQ4_XS": "Q8_K",
    "F16": "F16", "BF16": "BF16", "F32": None,
}
BLOCK = {"Q8_0": 32, "Q8_1": 32, "Q8_K": 256}
# ggml's flash attention takes its tiled kernel (f32 Q and accumulator) from this many query rows
# (measured: from llama.cpp's own q, k, v, the one-chunk kernel gives its z to 1e-5 at 63 rows and
# 6e-4 at 64, the f32 kernel 5e-4 and 2e-7)
TILED_ROWS = 64


def parse_steps(text: str, option: str = "--emulate") -> tuple[str, ...]:
    """`kv,act-q8` -> ("kv", "act-q8"); `all` -> every step in ladder order. BadInput names the
    value for an unknown, repeated or empty step."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise BadInput(f"{option} {text!r}: give steps separated by commas, from "
                       f"{', '.join(STEPS)} (or {ALL})")
    if parts == [ALL]:
        return tuple(STEPS)
    if ALL in parts:
        raise BadInput(f"{option} {text!r}: {ALL!r} is every step ({', '.join(STEPS)}); give "
                       f"it alone, or list the steps without it")
    for p in parts:
        if p not in STEPS:
            raise BadInput(f"{option}: unknown step {p!r}; known: {', '.join(STEPS)} "
                           f"(or {ALL} for every one)")
    seen = [p for i, p in enumerate(parts) if p in parts[:i]]
    if seen:
        raise BadInput(f"{option}: step {seen[0]!r} is given twice")
    return tuple(parts)


def ladder(steps: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """The rungs: no step, then each step added in turn."""
    return tuple(tuple(steps[:i]) for i in range(len(steps) + 1))


# ---------------------------------------------------------------- rounding and 8-bit blocks

def round_to(x: Any, kind: str | None) -> Any:
    """x (float32) rounded to `kind` (F16, BF16, F32/None: unchanged), back in float32."""
    import torch

    if kind in (None, "F32", "f32"):
        return x
    dtype = {"F16": torch.float16, "f16": torch.float16, "BF16": torch.bfloat16,
             "bf16": torch.bfloat16}[kind]
    return x.to(dtype).to(x.dtype)


def _blocks(x: Any, n: int) -> Any:
    if x.shape[-1] % n:
        raise BadInput(f"a row of {x.shape[-1]} values cannot be cut into llama.cpp's blocks "
                       f"of {n}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // n, n)


def _inverse(d: Any) -> Any:
    """1 / d in float32, 0 where d is 0: the multiplier ggml quantizes a block with (1 / d, not
    127 / max|x|: the two differ in the last bit, which moves a value that sits near a rounding
    boundary to the other side; measured on a 7-token prompt of the bundled model)."""
    import torch

    return torch.where(d > 0, 1.0 / torch.where(d > 0, d, 1.0), torch.zeros_like(d))


def q8_0(x: Any) -> Any:
    """x quantized as ggml's CPU quantizes a row to Q8_0 (or the values of Q8_1), dequantized:
    per block of 32, d = max|x| / 127 (kept in f16), q = round(x · (1 / d)) (to nearest, ties
    to even, as its SIMD code rounds), the value q · f16(d)."""
    import torch

    b = _blocks(x.float(), 32)  # (..., nb, 32)
    amax = b.abs().amax(dim=-1, keepdim=True)  # (..., nb, 1)
    d = amax / 127.0
    q = torch.round(b * _inverse(d))
    return (q * d.to(torch.float16).float()).reshape(x.shape)


def q8_1_sums(x: Any) -> tuple[Any, Any]:
    """Q8_1 of x: the dequantized values (as q8_0) and, per block, the difference between the
    sum ggml stores (f16 of d · Σq, d before its own rounding) and the sum of the dequantized
    values (f16(d) · Σq): (values, (..., nb) sums' error). A Q4_1/Q5_1 product adds each
    weight block's minimum times the stored sum, so this difference reaches its output."""
    import torch

    b = _blocks(x.float(), 32)
    amax = b.abs().amax(dim=-1, keepdim=True)
    d = amax / 127.0
    q = torch.round(b * _inverse(d))
    d16 = d.to(torch.float16).float()
    qsum = q.sum(dim=-1, keepdim=True)
    stored = (d * qsum).to(torch.float16).float()
    return (q * d16).reshape(x.shape), (stored - d16 * qsum).squeeze(-1)


def q8_k(x: Any) -> Any:
    """x quantized to Q8_K and dequantized: per block of 256, the value of largest magnitude
    `max` (the first one), iscale = −127 / max, q = min(127, round(iscale · x)) (ties to even),
    d = 1 / iscale kept in f32, the value q · d."""
    import torch

    b = _blocks(x.float(), 256)  # (..., nb, 256)
    idx = b.abs().argmax(dim=-1, keepdim=True)  # the first of the largest |x|
    mx = torch.gather(b, -1, idx)  # (..., nb, 1), signed
    zero = mx == 0
    iscale = torch.where(zero, torch.zeros_like(mx), -127.0 / torch.where(zero, 1.0, mx))
    q = torch.clamp(torch.round(iscale * b), max=127.0)
    d = torch.where(zero, torch.zeros_like(mx), 1.0 / torch.where(zero, 1.0, iscale))
    return (q * d).reshape(x.shape)


def activation(x: Any, weight_type: str) -> Any:
    """A product's input as ggml's CPU backend hands it to the dot product with a weight of
    `weight_type` (a GGUF type name: Q4_1, Q8_0, Q4_K, F16, ...)."""
    kind = VEC_DOT.get(weight_type)
    if kind is None:
        return x
    if kind in ("F16", "BF16"):
        return round_to(x, kind)
    return {"Q8_0": q8_0, "Q8_1": q8_0, "Q8_K": q8_k}[kind](x)


def block_minimums(weight: Any) -> Any:
    """(out, in/32) the minimum of each block of 32 of a Q4_1/Q5_1 weight's rows: the block's
    `m`, since the dequantized value is d·q + m with q ≥ 0 and its smallest q is 0 (checked by
    the caller against the weight)."""
    return _blocks(weight.float(), 32).amin(dim=-1)


def quantized_product(x: Any, weight: Any, bias: Any, weight_type: str,
                      minimums: Any | None = None) -> Any:
    """F.linear as llama.cpp computes it: the input quantized to the weight type's vec_dot_type
    (and, for a Q8_1 input, each block's stored sum as ggml rounds it, through the weight
    blocks' minimums)."""
    import torch.nn.functional as F

    if VEC_DOT.get(weight_type) == "Q8_1":
        xq, err = q8_1_sums(x)
        out = F.linear(xq, weight, bias)
        if minimums is not None:
            out = out + err @ minimums.t()  # (..., nb) @ (nb, out)
        return out
    return F.linear(activation(x, weight_type), weight, bias)


# ---------------------------------------------------------------- norms

def rms_norm(x: Any, weight: Any, eps: float) -> Any:
    """RMSNorm as ggml's CPU backend computes it: each square in float32, their sum in double,
    the mean rounded to float32, scale = 1 / sqrt(mean + eps) in float32, x · scale, then the
    product with the weight (a separate op)."""
    import torch

    x = x.float()
    mean = ((x * x).double().sum(dim=-1, keepdim=True) / x.shape[-1]).float()
    scale = 1.0 / torch.sqrt(mean + torch.tensor(eps, dtype=torch.float32))
    return (x * scale) * weight.float()


# ---------------------------------------------------------------- attention

def _causal(tq: int, tk: int, device: Any) -> Any:
    import torch

    i = torch.arange(tq, device=device)[:, None] + (tk - tq)
    return torch.arange(tk, device=device)[None, :] <= i  # (Tq, Tk) True where allowed


def _allowed(mask: Any, tq: int, tk: int, device: Any) -> Any:
    """(B or 1, 1 or nh, Tq, Tk) bool: where a query may read a key."""
    import torch

    if mask is None:
        return _causal(tq, tk, device)[None, None]
    if mask.dtype == torch.bool:
        return mask[..., :tk]
    return torch.isfinite(mask[..., :tk]) & (mask[..., :tk] > torch.finfo(mask.dtype).min)


def _expf(x: Any) -> Any:
    """exp in float32, correctly rounded (libm's expf, which ggml's scalar loops call, is)."""
    return x.double().exp().float()


def attention(q: Any, k: Any, v: Any, mask: Any, scale: float, *, cache: str,
              kernel: str | None) -> tuple[Any, Any]:
    """Attention as llama.cpp computes it on CPU. q (B, nh, Tq, hd), k and v (B, nkv, Tk, hd) in
    float32 (the K/V already in the cache's type where that step is on); mask: transformers'
    (None: causal). kernel: "flash" (llama.cpp's flash attention), "plain" (without it) or
    None (float32, as transformers). Returns (B, Tq, nh, hd) and the probabilities (None for
    the flash kernel, which never forms them)."""
    import torch

    B, nh, tq, hd = q.shape
    nkv = k.shape[1]
    if nkv != nh:  # grouped-query attention: each K/V head serves nh / nkv query heads
        k = k.repeat_interleave(nh // nkv, dim=1)  # (B, nh, Tk, hd)
        v = v.repeat_interleave(nh // nkv, dim=1)
    tk = k.shape[2]
    allowed = _allowed(mask, tq, tk, q.device)  # broadcastable to (B, nh, Tq, Tk)
    tiled = kernel == "flash" and tq >= TILED_ROWS
    if kernel in ("flash", "plain") and not tiled:
        q = round_to(q, cache)  # the product with the cached K casts Q to the cache's type
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, nh, Tq, Tk) f32
    if kernel != "flash" or tiled:
        scores = scores.masked_fill(~allowed, float("-inf"))
        p = torch.softmax(scores, dim=-1)  # (B, nh, Tq, Tk)
        if kernel == "plain":
            p = round_to(p, "F16")  # the product with the f16 V casts the probabilities
        out = torch.matmul(p, v)  # (B, nh, Tq, hd)
        return out.transpose(1, 2).contiguous(), p
    # flash attention, key by key: running max M, running sum S, an f16 accumulator of V
    allowed = allowed.expand(B, nh, tq, tk)
    M = torch.full((B, nh, tq, 1), float("-inf"), dtype=torch.float32, device=q.device)
    S = torch.zeros_like(M)
    acc = torch.zeros((B, nh, tq, hd), dtype=torch.float16, device=q.device)
    for j in range(tk):
        s = scores[..., j:j + 1]  # (B, nh, Tq, 1)
        ok = allowed[..., j:j + 1]
        new_max = ok & (s > M)
        ms = torch.where(new_max, _expf(M - s), torch.ones_like(s))
        vs = torch.where(new_max, torch.ones_like(s), _expf(s - M))
        M = torch.where(new_max, s, M)
        scaled = torch.where(new_max, (acc.float() * ms).half(), acc)
        # acc + v · vs with one rounding to float32 (ggml's fused multiply-add), then to f16
        summed = (scaled.double() + v[:, :, j:j + 1, :].double() * vs.double()).float().half()
        acc = torch.where(ok, summed, acc)
        S = torch.where(ok, S * ms + vs, S)
    inv = torch.where(S == 0, torch.zeros_like(S), 1.0 / S)
    out = acc.float() * inv  # (B, nh, Tq, hd)
    return out.transpose(1, 2).contiguous(), None


def q_scale(head_dim: int) -> float:
    """1/√head_dim as llama.cpp's graph computes it, in float: 1.0f / sqrtf(head_dim)."""
    import numpy as np

    return float(np.float32(1.0) / np.sqrt(np.float32(head_dim)))


def attention_function(cache: str, kv: bool, kernel: str | None, q_scaled: bool = False):
    """A transformers attention function (the AttentionInterface signature) that rounds K and V
    to `cache` (when kv) and computes attention with `kernel`. q_scaled: the graph multiplies q
    by 1/√head_dim (in float32) before attention, whose own scale is then 1 (Phi-3's), so the
    kernel rounds the scaled q; with `kernel` None (float32 attention) it changes nothing."""

    def attend(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
               scaling: float | None = None, dropout: float = 0.0, **kwargs: Any):
        if kv:
            key, value = round_to(key, cache), round_to(value, cache)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        if q_scaled and kernel is not None:
            query, scale = query * q_scale(query.shape[-1]), 1.0
        if kernel is None:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, attention_mask,
                                          scaling=scale, dropout=dropout, **kwargs)
        return attention(query, key, value, attention_mask, scale, cache=cache, kernel=kernel)

    return attend


def weight_types(path: str) -> dict[str, str]:
    """The element type of every tensor of a GGUF file, by its GGUF name (blk.3.attn_q.weight:
    Q4_1). Reading a file parses its whole vocabulary (~4 s for SmolLM2's), so what was read is
    kept for as long as the file keeps its size and modification time (a ladder asks once per
    rung)."""
    import os

    st = os.stat(path)
    return dict(_weight_types(os.path.realpath(path), st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _weight_types(path: str, size: int, mtime_ns: int) -> dict[str, str]:
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


__all__ = [
    "ALL",
    "STEPS",
    "VEC_DOT",
    "activation",
    "attention",
    "attention_function",
    "block_minimums",
    "ladder",
    "parse_steps",
    "q8_0",
    "q8_1_sums",
    "q8_k",
    "q_scale",
    "quantized_product",
    "rms_norm",
    "round_to",
    "weight_types",
]
