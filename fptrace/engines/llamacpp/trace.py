"""A Trace of the pass llama.cpp computes (`run --engine llama.cpp`, `diff --engine-b llama.cpp`).

llama.cpp runs the GGUF with its own tokenizer and kernels; its graph tensors, mapped onto the
points of points.py through the family's llama.cpp names, fill the same Capture the hooks of a
transformers pass fill, so the table (norms, attention and MLP added, lens, top-k) is computed
by the same code from llama.cpp's numbers. The checkpoint loaded in transformers supplies what
the table needs besides the pass: token texts, the model's facts, and the final norm and head
the logit lens applies to each of llama.cpp's streams.

Three checks hold on every run, on llama.cpp's own tensors:
- the stream is continuous: block k's output (`l_out-k`) is block k+1's input (read as
  `ffn_inp − attn_out` of block k+1), and the embedding is block 0's input;
- each block adds up: `ffn_inp + ffn_out = l_out` (and the table's attention + MLP = Δ check);
(Llama's names: each architecture's come from its family's map, whose `added` names what the
stream receives: Gemma 2's `sa_out − attn_post_norm` and `sa_out + ffn_post_norm`, say);
- the logits are the last stream through the output norm and head: llama.cpp's `result_norm`
  against the checkpoint's final norm of `l_out` (float32, exact to rounding), and its logits
  against the head applied to `result_norm` (llama.cpp rounds the head's input to 8 bits in a
  quantized product, hence the looser bound).
A broken stream or a block that does not add up is a Mismatch (the mapping would be wrong);
logits that do not match withhold the logit lens, with the measured gap in a note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fptrace.core import stats
from fptrace.core.hooks import Capture
from fptrace.core.trace import first_nonfinite, layer_stats, model_info
from fptrace.engines.llamacpp.capture import EngineOptions, LlamaCppPass, run_pass
from fptrace.engines.llamacpp.notes import LLAMACPP_ENGINE, LLAMACPP_LENS_WITHHELD, LLAMACPP_TOKENS
from fptrace.errors import BadInput, Mismatch, param
from fptrace.families import LlamaCppNames, llamacpp_names_for
from fptrace.models.loading import LoadedModel
from fptrace.points import BLOCK, Point
from fptrace.results import FinalNormStats, ShapeStep, TopToken, Trace

# float32 sums of the same numbers in another order: the stream and the block sums hold to this
SUM_TOLERANCE = 1e-5
# the final norm, recomputed in float32 from the same stream
NORM_TOLERANCE = 1e-4
# the head: llama.cpp quantizes its input to 8-bit blocks inside a quantized product
LOGITS_TOLERANCE = 5e-2


@dataclass(frozen=True)
class EngineChecks:
    """The three checks of one llama.cpp pass, measured (relative to the larger side's norm)."""

    stream_rel: float  # worst |l_out-k − input of block k+1| (and embd vs block 0's input)
    stream_block: int | None  # where it is worst
    sums_rel: float  # worst |ffn_inp + ffn_out − l_out|
    sums_block: int | None
    norm_rel: float  # result_norm vs the checkpoint's final norm of the last stream
    logits_rel: float  # llama.cpp's logits vs the head applied to result_norm
    # where NaN or Inf first appears in llama.cpp's tensors (embed, block N, final_norm,
    # logits): the checks are measured up to there only (NaN when they could not be)
    nonfinite: str | None = None

    @property
    def logits_hold(self) -> bool:
        return self.norm_rel <= NORM_TOLERANCE and self.logits_rel <= LOGITS_TOLERANCE


def rel(a: np.ndarray, b: np.ndarray) -> float:
    scale = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)))
    d = float(np.linalg.norm(a.astype(np.float64) - b.astype(np.float64)))
    return d / scale if scale > 0 else (0.0 if d == 0 else float("inf"))


def squeeze(x: np.ndarray, keep: int) -> np.ndarray:
    """Drop ggml's leading unit dimensions down to `keep` dimensions."""
    while x.ndim > keep and x.shape[0] == 1:
        x = x[0]
    return x


def names_for(lm_pass: LlamaCppPass) -> LlamaCppNames:
    names = llamacpp_names_for(lm_pass.architecture, lm_pass.experts)
    if names is None:
        raise BadInput(f"llama.cpp ran {lm_pass.path!r} (architecture "
                       f"{lm_pass.architecture!r}) but no fptrace family maps its graph's "
                       "names; mapped: " + ", ".join(_mapped()))
    return names


def _mapped() -> list[str]:
    from fptrace.families import FAMILIES

    return sorted({a for f in FAMILIES if f.llamacpp_names for a in f.llamacpp_names.archs})


def wanted_names() -> frozenset[str]:
    """The graph names any family maps (the engine copies only these out of the graph)."""
    from fptrace.families import FAMILIES

    return frozenset(n for f in FAMILIES if f.llamacpp_names
                     for n in copied(f.llamacpp_names))


def copied(names: LlamaCppNames) -> frozenset[str]:
    """The graph names one family's map copies: its points, the fused products its parts are
    cut from, and its router's nodes."""
    return frozenset(names.points.values()) | frozenset(n for n, *_ in names.parts.values()) \
        | frozenset(names.routing or ())


def routing(lm: LoadedModel, lm_pass: LlamaCppPass, names: LlamaCppNames) -> Any:
    """The trace's routing from llama.cpp's own router nodes (logits, the experts chosen and
    their weights, per MoE block), checked as a transformers pass's is: the family's routing
    rule recomputed from llama.cpp's logits must choose llama.cpp's experts with its weights;
    None for a dense model or a map without router nodes."""
    import torch

    from fptrace.core.routing import RouterCapture, moe_facts, routers, routing_of_rows, score_bias

    moe = moe_facts(lm.parts, lm.config)
    if moe is None or names.routing is None:
        return None
    logits_name, chosen_name, weights_name = names.routing
    T = len(lm_pass.ids)
    cap = RouterCapture()
    for k in range(lm_pass.n_layer):
        chosen = lm_pass.get(chosen_name, k)
        logits, weights = lm_pass.get(logits_name, k), lm_pass.get(weights_name, k)
        if chosen is None or logits is None or weights is None:  # a dense block
            continue
        cap.blocks.append(k)
        cap.logits[k] = torch.from_numpy(logits.reshape(T, -1).copy())
        cap.indices[k] = torch.from_numpy(chosen.reshape(T, -1).astype(np.int64))
        cap.weights[k] = torch.from_numpy(weights.reshape(T, -1).copy())
    for k, router in routers(lm.parts):  # a choice-only bias (DeepSeek-V3's), the file's own
        bias = score_bias(lm.parts, router) if k in cap.logits else None
        if bias is not None:
            cap.biases[k] = bias.detach().float().cpu()
    return routing_of_rows(cap, moe, 1, T, [T], "float32")[0] if cap.blocks else None


def block_points(lm_pass: LlamaCppPass, names: LlamaCppNames, layer: int,
                 n_heads: int, n_kv_heads: int) -> dict[Point, np.ndarray]:
    """One block's points from llama.cpp's tensors, in fptrace's shapes and order: streams and
    vectors (T, width); q (nh, T, hd), k and v (nkv, T, hd), in the checkpoint's order of each
    head's values (un-permuted where llama.cpp keeps rotary pairs side by side)."""
    out: dict[Point, np.ndarray] = {}
    prev = names.points[Point.embed] if layer == 0 else \
        f"{names.points[Point.resid_post]}-{layer - 1}"
    if prev in lm_pass.tensors:
        out[Point.resid_pre] = squeeze(lm_pass.tensors[prev], 2)
    for point in BLOCK:
        name = names.points.get(point)
        x = lm_pass.get(name, layer) if name else None
        if point in names.parts:  # a slice of a fused product (Phi-3's gate and up)
            fused, i, parts = names.parts[point]
            x = lm_pass.get(fused, layer)
            if x is not None:
                width = x.shape[-1] // parts
                x = x[..., i * width:(i + 1) * width]
        if x is None:
            continue
        if point in (Point.q, Point.k, Point.v):
            heads = n_heads if point == Point.q else n_kv_heads
            x = squeeze(x, 3).reshape(-1, heads, x.shape[-1])  # (T, nh, hd)
            if names.rope_adjacent and point != Point.v:
                hd = x.shape[-1]
                x = np.concatenate([x[..., 0:hd:2], x[..., 1:hd:2]], axis=-1)
            if names.q_scaled and point == Point.q:  # Phi-3's q, scaled before attention
                x = x * np.float32(math.sqrt(x.shape[-1]))
            x = np.ascontiguousarray(x.transpose(1, 0, 2))  # (nh, T, hd)
        else:
            x = squeeze(x, 2)
        out[point] = x
    return out


def checks(lm: LoadedModel, lm_pass: LlamaCppPass, names: LlamaCppNames) -> EngineChecks:
    import torch

    n = lm_pass.n_layer
    p = names.points
    stream = {-1: squeeze(lm_pass.tensors[p[Point.embed]], 2)}
    worst_stream, at_stream, worst_sum, at_sum = 0.0, None, 0.0, None
    bad = None if finite(stream[-1]) else "embed"
    for k in range(n if bad is None else 0):
        out_k = squeeze(lm_pass.tensors[f"{p[Point.resid_post]}-{k}"], 2)
        attn = squeeze(lm_pass.tensors[f"{p[names.added[0]]}-{k}"], 2)
        mlp = squeeze(lm_pass.tensors[f"{p[names.added[1]]}-{k}"], 2)
        # a parallel residual (GPT-NeoX's) has no stream between attention and the MLP: both
        # read the block's input, so the block adds up when input + attention + MLP is its
        # output (which holds the input to the previous block's output too)
        mid = squeeze(lm_pass.tensors[f"{p[Point.resid_mid]}-{k}"], 2) \
            if Point.resid_mid in p else stream[k - 1] + attn
        if not finite(out_k, mid, attn, mlp):  # a NaN or Inf weight, say: not a wrong mapping
            bad = f"block {k}"
            break
        r = rel(mid - attn, stream[k - 1])  # block k's input, as its attention add read it
        if r > worst_stream:
            worst_stream, at_stream = r, k
        r = rel(mid + mlp, out_k)
        if r > worst_sum:
            worst_sum, at_sum = r, k
        stream[k] = out_k
    final = squeeze(lm_pass.tensors[p[Point.final_norm]], 2)[-1:]
    if bad is None and not finite(final):
        bad = "final_norm"
    if bad is None and not finite(lm_pass.logits[-1:]):
        bad = "logits"
    if bad is not None:
        return EngineChecks(stream_rel=worst_stream, stream_block=at_stream, sums_rel=worst_sum,
                            sums_block=at_sum, norm_rel=math.nan, logits_rel=math.nan,
                            nonfinite=bad)
    last = torch.from_numpy(stream[n - 1][-1:].copy())
    with torch.inference_mode():
        ours = lm.parts.final_norm(last.to(lm.device, lm.dtype)).float().cpu().numpy()
        head = lm.parts.head(torch.from_numpy(final.copy()).to(lm.device, lm.dtype))
        head = head.float().cpu().numpy()
    return EngineChecks(stream_rel=worst_stream, stream_block=at_stream, sums_rel=worst_sum,
                        sums_block=at_sum, norm_rel=rel(ours, final),
                        logits_rel=rel(head, lm_pass.logits[-1:]))


def finite(*arrays: np.ndarray) -> bool:
    return all(bool(np.isfinite(a).all()) for a in arrays)


def enforce(c: EngineChecks, names: LlamaCppNames) -> None:
    """A broken stream or a block that does not add up: the mapping is wrong, stop."""
    p = names.points
    if c.stream_rel > SUM_TOLERANCE:
        raise Mismatch(f"llama.cpp's stream is not continuous: block {c.stream_block}'s input "
                       f"differs from the previous block's output by {c.stream_rel:.2g} "
                       "(relative); the graph's names are not mapped as fptrace assumes")
    if c.sums_rel > SUM_TOLERANCE:
        raise Mismatch(f"llama.cpp's block {c.sums_block} does not add up: "
                       f"{p.get(Point.resid_mid, 'its input + attention')} + "
                       f"{p[names.added[1]]} differs from "
                       f"{p[Point.resid_post]} by {c.sums_rel:.2g} (relative)")


def gguf_path(model: str) -> str:
    """The GGUF file a --model names, or BadInput: llama.cpp runs GGUF files only."""
    from fptrace.engines.llamacpp.capture import check_gguf
    from fptrace.models.registry import resolve

    spec = resolve(model)
    if spec.kind != "gguf":
        raise BadInput(f"{param('engine')} llama.cpp runs GGUF files; {model!r} is a "
                       f"{'model folder' if spec.kind == 'folder' else 'hub model'}, not a "
                       ".gguf file")
    if spec.path is None:
        raise BadInput(f"{param('engine')} llama.cpp needs the GGUF file of {model!r}, which is "
                       f"not "
                       "installed")
    check_gguf(spec.path)
    return spec.path


def run_llamacpp(path: str, prompt: str, options: EngineOptions | None = None,
                 ids: list[int] | None = None) -> LlamaCppPass:
    """llama.cpp's pass over `prompt` (or `ids`), with every point its family maps copied out
    (every family's names, where the file's architecture is mapped by none: the pass then
    fails to load, or names_for says so)."""
    from fptrace.engines.llamacpp.capture import check_gguf

    meta = check_gguf(path)
    names = llamacpp_names_for(meta.architecture, meta.experts) if meta.architecture else None
    wanted = wanted_names() if names is None else copied(names)
    return run_pass(path, prompt, options or EngineOptions(), ids=ids, wanted=wanted,
                    operands=names.operands if names else None, meta=meta,
                    first=names.first if names else ())


def llamacpp_trace(lm: LoadedModel, lm_pass: LlamaCppPass, *, top_k: int = 10,
                   snippet: int = 4, given_ids: bool = False
                   ) -> tuple[Trace, EngineChecks]:
    """The Trace of llama.cpp's pass `lm_pass` (`lm`: the same GGUF loaded in transformers, for
    token texts, facts and the lens). given_ids: the ids were given to llama.cpp (its own
    tokenizer was not used); the prompt is then their decoding."""
    import torch

    if top_k < 1:
        raise BadInput(f"{param('top_k')} must be at least 1")
    if snippet < 0:
        raise BadInput(f"{param('snippet')} must be 0 or more")
    options = lm_pass.options
    names = names_for(lm_pass)
    c = checks(lm, lm_pass, names)
    enforce(c, names)
    p = names.points
    n = lm_pass.n_layer

    def last(name: str) -> Any:  # (1, d) float32 tensor of the last position
        return torch.from_numpy(squeeze(lm_pass.tensors[name], 2)[-1:].copy())

    def full(name: str) -> Any:  # (1, T, d)
        return torch.from_numpy(squeeze(lm_pass.tensors[name], 2).copy())[None]

    cap = Capture(mask=None, home=torch.device("cpu"))
    embed = full(p[Point.embed])
    cap.embed_last = embed[:, -1]
    cap.keep_norms(0, embed)
    cap.shapes["embed"] = tuple(embed.shape)
    for k in range(n):
        h = full(f"{p[Point.resid_post]}-{k}")
        cap.resid_last.append(h[:, -1])
        cap.keep_norms(k + 1, h)
        cap.attn_last.append(last(f"{p[names.added[0]]}-{k}"))
        cap.mlp_last.append(last(f"{p[names.added[1]]}-{k}"))
        cap.shapes[f"block {k}"] = tuple(h.shape)
    final = full(p[Point.final_norm])
    cap.final_last = final[:, -1]
    cap.shapes["final_norm"] = tuple(final.shape)
    per_row, decomposition = layer_stats(lm, cap, snippet=snippet, logit_lens=c.logits_hold)
    rows = per_row[0]
    logits = torch.from_numpy(lm_pass.logits[-1].copy())
    top_ids, top_p, top_l = stats.top_k(logits, top_k)
    info = model_info(lm)
    notes = [LLAMACPP_ENGINE(version=options_text(options))]
    if (withheld := decomposition[0].note()) is not None:
        notes.insert(0, withheld)
    if not c.logits_hold and c.nonfinite is None:  # NaN or Inf: the run fails, naming where
        notes.append(LLAMACPP_LENS_WITHHELD(norm=c.norm_rel, logits=c.logits_rel))
    if given_ids and lm_pass.own_ids is not None and lm_pass.own_ids != lm_pass.ids:
        notes.append(tokens_note(lm, lm_pass))
    first_bad = first_nonfinite(rows)
    if first_bad is None and not stats.is_finite(cap.final_last[0], logits):
        first_bad = "final_norm"
    first_bad = first_bad or c.nonfinite  # in llama.cpp's tensors though not in the rows
    T, V = len(lm_pass.ids), lm_pass.logits.shape[-1]
    trace = Trace(
        prompt=lm_pass.prompt, model=info, tokens=lm.tokens(list(lm_pass.ids)),
        shapes=(ShapeStep("input_ids", "input_ids", (1, T)),
                ShapeStep("embed", "embedding", (1, T, info.d_model)),
                *(ShapeStep("resid_post", f"block {k}", (1, T, info.d_model))
                  for k in range(n)),
                ShapeStep("final_norm", "final norm", (1, T, info.d_model)),
                ShapeStep("logits", "lm_head → logits", (1, 1, V))),
        layers=rows,
        final_norm=FinalNormStats(norm_last=float(stats.norms(cap.final_last[0])),
                                  snippet=tuple(float(x) for x in
                                                cap.final_last[0, :snippet].tolist())),
        top_k=tuple(TopToken(r + 1, i, lm.token_text(i), pr, lg)
                    for r, (i, pr, lg) in enumerate(zip(top_ids, top_p, top_l))),
        all_positions=False, truncated=0, first_nonfinite=first_bad, notes=tuple(notes),
        decomposition=decomposition[0], engine="llama.cpp",
        routing=routing(lm, lm_pass, names))
    return trace, c


def tokens_note(lm: LoadedModel, lm_pass: LlamaCppPass) -> str:
    """Both tokenizations of the prompt, named (llama.cpp ran the ids given)."""
    return LLAMACPP_TOKENS(llamacpp=[lm.token_text(i) for i in lm_pass.own_ids or ()],
                           transformers=[lm.token_text(i) for i in lm_pass.ids])


def options_text(options: EngineOptions) -> str:
    from fptrace.engines.llamacpp.binding import PACKAGE, PINNED_VERSION

    return (f"{PACKAGE} {PINNED_VERSION}, flash attention {options.flash_attn}, K/V cache "
            f"{options.cache_type}, {options.threads} threads")


__all__ = ["EngineChecks", "block_points", "checks", "gguf_path", "llamacpp_trace", "names_for",
           "run_llamacpp", "tokens_note"]
