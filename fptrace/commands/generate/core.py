"""`fptrace generate`: generation as a sequence of forward passes, with the KV cache visible.

The prefill runs the whole prompt once and fills the cache; each decode step then runs one new
token (input (1, 1)) against the cached keys and values of every earlier position. After every
step the cache's shape and size are read from the cache object itself, the next token is chosen
by the pure functions of sampling.py, and the step is handed to `on_step` as soon as it exists,
so the caller can print the text as it grows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fptrace.commands.generate.notes import TENSOR_PARALLEL_KV
from fptrace.commands.generate.result import Generation, GenStep
from fptrace.core import sampling, stats
from fptrace.core.hooks import Capture, Hook, capture_stats, hooked
from fptrace.core.trace import base_notes, first_nonfinite, layer_stats, model_info, ranked_token
from fptrace.errors import BadInput, param
from fptrace.models.kv_cache import cache_kwargs
from fptrace.models.loading import LoadedModel
from fptrace.models.prompts import Prepared, Prompt
from fptrace.results import FinalNormStats, TopToken

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fptrace.results import ModelInfo


def _kv(cache: Any) -> tuple[tuple[int, ...], int, int, tuple[str, ...]]:
    """One layer's key shape, the number of layers, the bytes of all keys and values, and the
    shape of every layer's keys as ranges ("layers 0–29: (1, 3, 16, 64)")."""
    layers = getattr(cache, "layers", None)
    if layers is None:  # older caches keep key_cache / value_cache lists
        keys, values = cache.key_cache, cache.value_cache
    else:
        keys = [layer.keys for layer in layers]
        values = [layer.values for layer in layers]
    total = sum(t.numel() * t.element_size() for t in (*keys, *values) if t is not None)
    shapes = [tuple(int(d) for d in k.shape) for k in keys]
    runs: list[list] = []  # [first, last, shape]
    for i, sh in enumerate(shapes):
        if runs and runs[-1][2] == sh:
            runs[-1][1] = i
        else:
            runs.append([i, i, sh])
    layout = tuple((f"layer {a}" if a == b else f"layers {a}–{b}") + ": ("
                   + ", ".join(str(d) for d in sh) + ")" for a, b, sh in runs)
    return shapes[0], len(keys), int(total), layout


def check_new_tokens(max_new_tokens: int, what: str = "max_new_tokens") -> None:
    """`what`: how the caller names the count (the CLI: -n)."""
    if max_new_tokens < 1:
        raise BadInput(f"{what} must be at least 1, not {max_new_tokens}")


def check_length(lm: LoadedModel, n_prompt: int, max_new_tokens: int, alternatives: int = 1
                 ) -> None:
    check_new_tokens(max_new_tokens)
    if alternatives < 1:
        raise BadInput(f"{param('alternatives')} must be at least 1")
    ctx = getattr(lm.config, "max_position_embeddings", None)
    if ctx and n_prompt + max_new_tokens > ctx:
        raise BadInput(f"the prompt is {n_prompt} tokens and -n {max_new_tokens} would reach "
                       f"position {n_prompt + max_new_tokens - 1}, beyond the context window of "
                       f"{ctx}; use -n {max(ctx - n_prompt, 0)} or less")


def generate(lm: LoadedModel, prompt: Prompt, *, max_new_tokens: int = 12,
             temperature: float = 0.0, top_k: int | None = None, top_p: float = 1.0,
             seed: int = 0, layers: bool = False, alternatives: int = 5, snippet: int = 4,
             stop_at_eos: bool = True, on_step: Callable[[GenStep, str], None] | None = None,
             logits_out: list | None = None) -> Generation:
    """Generate up to `max_new_tokens` tokens, one traced forward pass each.

    on_step(step, text_so_far) is called after every step. `logits_out`, when a list, receives
    each step's last-position logits (float32, on the CPU), for checks against a full forward.
    """
    import torch
    from transformers import DynamicCache

    sampling.check_generation(temperature, top_k, top_p)
    prepared = lm.prepare(prompt)
    ids = list(prepared.ids)
    check_length(lm, len(ids), max_new_tokens, alternatives)
    info = model_info(lm)
    model = lm.model
    device = lm.device
    eos = sampling.eos_ids(lm.model) if stop_at_eos else set()
    cache = DynamicCache(config=lm.config)
    with_cache = cache_kwargs(model, cache)
    cuda = str(device).startswith("cuda")

    seen: dict[str, Any] = {}

    def stream_shape(module: nn.Module, args: tuple, kwargs: dict) -> None:
        h = args[0] if args else kwargs["hidden_states"]
        seen["shape"] = tuple(int(d) for d in h.shape)

    steps: list[GenStep] = []
    generated: list[int] = []
    stop_reason = "max_new_tokens"
    next_input = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)
    pos = 0
    with hooked([Hook.before(lm.parts.blocks[0], stream_shape, kwargs=True)]):
        for index in range(max_new_tokens):
            t0 = time.perf_counter()
            cap = Capture(mask=None, home=device)
            with torch.inference_mode(), (capture_stats(lm.parts, cap) if layers
                                          else contextlib.nullcontext()):
                out = model(next_input, logits_to_keep=1, **with_cache)
                logits = out.logits[0, -1].float()  # (V,)
                dist = sampling.distribution(logits, temperature, top_k, top_p)
                # greedy, or one draw per step, each from its own seeded generator
                choice = int(torch.argmax(dist)) if temperature == 0 else \
                    sampling.draw(dist, seed * 1_000_003 + index)
            if cuda:
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - t0
            if logits_out is not None:
                logits_out.append(logits.detach().cpu().clone())
            step = _step(lm, index, next_input, seen.get("shape", ()), pos, cache, logits, dist,
                         choice, seconds, cap if layers else None, alternatives, snippet)
            steps.append(step)
            generated.append(choice)
            pos += next_input.shape[1]
            if on_step is not None:
                on_step(step, _decode(lm, generated))
            if choice in eos:
                stop_reason = "eos"
                break
            next_input = torch.tensor([[choice]], dtype=torch.long, device=device)  # (1, 1)

    return _generation(lm, prepared, info, steps, generated, stop_reason, temperature,
                       top_k, top_p, seed, max_new_tokens)


def _generation(lm: LoadedModel, prepared: Prepared, info: ModelInfo, steps: list,
                generated: list[int], stop_reason: str, temperature: float, top_k: int | None,
                top_p: float, seed: int, max_new_tokens: int) -> Generation:
    prefill = steps[0].seconds
    decode = sum(s.seconds for s in steps[1:])
    notes = base_notes(lm)
    if lm.tensor_parallel > 1:
        notes.append(TENSOR_PARALLEL_KV(n=lm.tensor_parallel))
    return Generation(
        prompt=prepared.text, model=info,
        tokens=lm.tokens(prepared),
        strategy=sampling.describe(temperature, top_k, top_p), temperature=temperature,
        top_k=top_k, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens,
        steps=tuple(steps),
        generated=lm.tokens(generated, start=len(prepared.ids)),
        text=_decode(lm, generated), stop_reason=stop_reason, prefill_seconds=prefill,
        decode_seconds=decode,
        decode_tokens_per_s=(len(steps) - 1) / decode if decode > 0 else None,
        notes=tuple(notes))


def _step(lm: LoadedModel, index: int, next_input: torch.Tensor, stream_shape: tuple, pos: int,
          cache: Any, logits: torch.Tensor, dist: torch.Tensor, choice: int, seconds: float,
          cap: Capture | None, alternatives: int, snippet: int) -> GenStep:
    """One step's result: shapes, the cache as it is now, the choice and its alternatives, and
    with a Capture (--layers) the per-layer statistics and their decomposition check."""
    import torch

    kv_shape, kv_layers, kv_bytes, kv_layout = _kv(cache)
    alt_ids, alt_p, alt_l = stats.top_k(logits, alternatives)
    layer_rows: tuple = ()
    final = check = bad = None
    if cap is not None:
        rows, checks = layer_stats(lm, cap, snippet=snippet)
        layer_rows, check = rows[0], checks[0]
        fv = cap.final_last[0]
        final = FinalNormStats(norm_last=float(stats.norms(fv)),
                               snippet=tuple(float(x) for x in fv[:snippet].tolist()))
        bad = first_nonfinite(layer_rows)
    if bad is None and not bool(torch.isfinite(logits).all()):
        bad = "logits"
    n_in = next_input.shape[1]
    return GenStep(
        index=index, phase="prefill" if index == 0 else "decode",
        input_shape=tuple(int(d) for d in next_input.shape), stream_shape=stream_shape,
        positions=tuple(range(pos, pos + n_in)), kv_shape=kv_shape, kv_layers=kv_layers,
        kv_bytes=kv_bytes, kv_layout=kv_layout,
        token=ranked_token(lm, logits, choice),
        sample_prob=float(dist[choice]),
        alternatives=tuple(TopToken(r + 1, i, lm.token_text(i), p, lg)
                           for r, (i, p, lg) in enumerate(zip(alt_ids, alt_p, alt_l))),
        seconds=seconds, layers=layer_rows, final_norm=final, first_nonfinite=bad,
        decomposition=check)


def _decode(lm: LoadedModel, ids: list[int]) -> str:
    if lm.tokenizer is None:
        return " ".join(f"<{i}>" for i in ids)
    return lm.tokenizer.decode(ids)


__all__ = ["check_length", "generate"]
