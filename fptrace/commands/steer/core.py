"""`fptrace steer`: activation steering, measured layer by layer against the clean run.

A steering vector (commands/steer/vectors.py: two prompts, contrastive pairs, a file, a token) is added to
the output of one block (or several, from a file) at a sweep of strengths. Every strength is a
row of ONE batched forward pass, the clean run (strength 0) among them, so each row is compared
with a clean reference computed in the same pass. Per row: the new top-k, the target's logit
and probability change, KL(steered ‖ clean) of the logit lens at the last position after every
block from the first steered one (the last one is the model's own output), and the first block
whose logit-lens top-1 changed; with `new_tokens`, a greedy continuation per row, steered the
same way.

Every run checks its own numbers: after the first steered block the stream differs from the
clean one by exactly scale × v (at the last position, when it is steered), and the lens of the
last block is the model's own logits; the command fails (exit 5) when either does not hold.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fptrace.addresses import Block, Selection, resolve_selection
from fptrace.commands.steer.notes import STEER_BLOCK0, STEER_GGUF_BLOCKS, STEER_POSITIONS
from fptrace.commands.steer.result import Steering, SteeringVectorInfo, SteerRow
from fptrace.commands.steer.vectors import SteeringVector, match_norms, steering_vector
from fptrace.core import sampling, stats
from fptrace.core.attribution import rtol_for
from fptrace.core.fragments import token_id
from fptrace.core.interventions import (
    check_continuation,
    check_rows_fit,
    continue_greedy,
    run_rows,
    steering_hooks,
)
from fptrace.core.trace import base_notes, model_info, ranked_token
from fptrace.errors import BadInput, param
from fptrace.models.loading import LoadedModel
from fptrace.models.prompts import Prompt
from fptrace.results import Check, TopToken

if TYPE_CHECKING:
    import torch

LOWER = "sweep fewer strengths (--scale) or shorten the prompt"


def parse_scales(scales: str | float | Sequence[float]) -> tuple[float, ...]:
    """`--scale 4` or `--scale 0,1,2,4,8` as floats (repeats dropped, order kept)."""
    if isinstance(scales, (int, float)):
        items: list[Any] = [scales]
    elif isinstance(scales, str):
        items = [x.strip() for x in scales.split(",")]
    else:
        items = list(scales)
    out: list[float] = []
    for x in items:
        try:
            value = float(x)
        except (TypeError, ValueError):
            raise BadInput(f"{param('scale')} {scales!r}: {x!r} is not a number; give strengths "
                           f"such as "
                           "4 or 0,1,2,4,8") from None
        if not math.isfinite(value):
            raise BadInput(f"{param('scale')} {scales!r}: {x!r} is not a finite number")
        if value not in out:
            out.append(value)
    if not out:
        raise BadInput(f"{param('scale')}: give at least one strength, e.g. {param('scale')} 4")
    return tuple(out)


def steer(lm: LoadedModel, prompt: Prompt, *, add: str | None = None,
          subtract: str | None = None, pairs: str | Sequence[tuple[str, str]] | None = None,
          method: str = "mean", vector: str | SteeringVector | None = None,
          token: str | None = None, layer: int | Block | None = None,
          scales: str | float | Sequence[float] = 1.0,
          positions: Sequence[int] | Selection | None = None,
          mean_positions: bool = False, norm_match: bool = False, target: str | None = None,
          top: int = 5, new_tokens: int = 0) -> Steering:
    """Add a steering vector (from one source: add/subtract, pairs, vector, token) to the
    output of block `layer` (negative counts from the end) at a sweep of strengths, one batched
    forward pass, and measure each against the clean run. `positions`: None (every position,
    generated tokens included) or the prompt positions (negative count from the end)."""
    import torch

    strengths = parse_scales(scales)
    if top < 1:
        raise BadInput(f"{param('top')} must be at least 1")
    prepared = lm.prepare(prompt)
    ids = list(prepared.ids)
    T = len(ids)
    where = resolve_selection(positions, T, "positions", "the prompt", "position", "token")
    check_continuation(lm, T, new_tokens)
    given = None if target is None else token_id(lm, target, "--target", prepared)
    if isinstance(vector, SteeringVector):
        if any(v is not None for v in (add, subtract, pairs, token)):
            raise BadInput("give one source of the steering vector")
        vec = vector
    else:
        vec = steering_vector(lm, add=add, subtract=subtract, pairs=pairs, method=method,
                              vector=vector, token=token, layer=layer,
                              mean_positions=mean_positions, prompt=prepared)
    d, n = int(lm.config.hidden_size), len(lm.parts.blocks)
    for k, v in vec.layers.items():
        if not 0 <= k < n or tuple(v.shape) != (d,):
            raise BadInput(f"the steering vector for block {k} has shape {tuple(v.shape)}; "
                           f"{lm.name} has blocks 0 to {n - 1} of width {d}")
    rows_scale = strengths if 0.0 in strengths else (0.0,) + strengths
    clean = rows_scale.index(0.0)
    B = len(rows_scale)
    info = model_info(lm)
    first = min(vec.layers)
    kl_layers = tuple(range(first, info.n_layers))
    check_rows_fit(lm, B, T + new_tokens, f"a sweep of {B} strengths over {T} tokens", LOWER,
                   extra_bytes=3 * B * info.vocab_size * 4 * 2)
    if norm_match:
        vec = match_norms(lm, ids, vec)
    vectors = {k: v.to(lm.device) for k, v in vec.layers.items()}
    hooks = steering_hooks(lm, vectors, rows_scale, where)
    out = run_rows(lm, ids, B, hooks, LOWER)
    _finite_rows(out.logits, rows_scale, clean, vec)
    passes = vec.passes + 1
    cap = out.cap
    stream_norms = {k: float(cap.resid_last[k][clean].norm()) for k in vec.layers}
    t = int(out.logits[clean].argmax()) if given is None else given
    with torch.inference_mode():
        kl, lens_top = _lens(lm, cap, kl_layers, clean)  # (B, nL) each
    checks = _checks(lm, out, vec, rows_scale, clean, where, T)
    continuations: list[list[int]] = [[] for _ in rows_scale]
    if new_tokens:
        continuations = continue_greedy(lm, ids, out.logits.argmax(-1).tolist(), new_tokens,
                                        hooks)
        passes += new_tokens - 1
        eos = sampling.eos_ids(lm.model)
        continuations = [_until(c, eos) for c in continuations]
    clean_t = ranked_token(lm, out.logits[clean], t)
    rows = []
    for r, s in enumerate(rows_scale):
        ids_k, probs, logits_k = stats.top_k(out.logits[r], top)
        tok = ranked_token(lm, out.logits[r], t)
        changed = next((k for k, a, b in zip(kl_layers, lens_top[r], lens_top[clean])
                        if a != b), None)
        rows.append(SteerRow(
            scale=s, clean=r == clean,
            top=tuple(TopToken(i + 1, j, lm.token_text(j), p, lg)
                      for i, (j, p, lg) in enumerate(zip(ids_k, probs, logits_k))),
            target=tok, logit_change=tok.logit - clean_t.logit, prob_change=tok.prob - clean_t.prob,
            kl=tuple(kl[r]), lens_top=tuple(lm.token_text(j) for j in lens_top[r]),
            first_changed=changed,
            continuation=lm.tokens(continuations[r], start=T) if new_tokens else (),
            continuation_text=lm.prompt_text(continuations[r]) if new_tokens else None))
    vinfo = SteeringVectorInfo(
        source=vec.source, description=vec.description, layers=tuple(sorted(vec.layers)),
        norms=tuple(float(vec.layers[k].norm()) for k in sorted(vec.layers)),
        stream_norms=tuple(stream_norms[k] for k in sorted(vec.layers)),
        norm_matched=vec.norm_matched,
        method=vec.method, pairs=vec.pairs, path=vec.path)
    return Steering(
        prompt=prepared.text, model=info, tokens=lm.tokens(prepared), vector=vinfo,
        positions=where, target=clean_t, rows=tuple(rows), kl_layers=kl_layers,
        new_tokens=new_tokens, checks=tuple(checks), ok=all(c.ok for c in checks),
        forward_passes=passes, notes=tuple(_notes(lm, vec, where, rows_scale)))


def _lens(lm: LoadedModel, cap: Any, layers: tuple[int, ...], clean: int
          ) -> tuple[list[list[float]], list[list[int]]]:
    """Per row, after each block of `layers`: KL(row ‖ clean) of the logit lens at the last
    position (nats), and the lens's top-1 id. One block at a time: (B, V) in memory."""
    import torch

    B = cap.resid_last[0].shape[0]
    kl: list[list[float]] = [[] for _ in range(B)]
    top: list[list[int]] = [[] for _ in range(B)]
    for k in layers:
        logp = torch.log_softmax(lm.parts.project(cap.resid_last[k].to(lm.dtype)).float(), -1)
        row_kl = (logp.exp() * (logp - logp[clean])).sum(-1).clamp(min=0)  # (B,)
        ids = logp.argmax(-1)
        for r in range(B):
            kl[r].append(float(row_kl[r]))
            top[r].append(int(ids[r]))
    return kl, top


def _finite_rows(logits: torch.Tensor, scales: Sequence[float], clean: int,
                 vec: SteeringVector) -> None:
    """A strength whose steered run overflows to NaN or Inf is named (exit 4), not reported as a
    check that fails: the model computed what it was asked, at a strength it cannot hold."""
    import torch

    from fptrace.errors import NonFiniteValues

    finite = torch.isfinite(logits.reshape(len(scales), -1)).all(-1).tolist()  # (B,)
    if not finite[clean]:
        raise NonFiniteValues("NaN or Inf in the unsteered run (scale 0): the model itself "
                              "overflows on this prompt")
    bad = [s for s, ok in zip(scales, finite) if not ok]
    if bad:
        norm = max(float(v.norm()) for v in vec.layers.values())
        raise NonFiniteValues(f"{param('scale')} {bad[0]:g}: the steered run overflows to NaN or "
                              f"Inf "
                              f"(the vector's norm {norm:.3g} × {bad[0]:g}); "
                              + (f"{len(bad) - 1} more strength{'s' if len(bad) > 2 else ''} "
                                 "too; " if len(bad) > 1 else "")
                              + "choose smaller strengths")


def _checks(lm: LoadedModel, out: Any, vec: SteeringVector, scales: Sequence[float],
            clean: int, where: tuple[int, ...] | None, T: int) -> list[Check]:
    """The stream after the first steered block minus the clean one is scale × v at the last
    position (0 when the last position is not steered); the last block's lens is the model's
    logits."""
    import torch

    info = model_info(lm)
    rtol = rtol_for(info.dtype)
    first = min(vec.layers)
    h = out.cap.resid_last[first]  # (B, d) float32
    v = vec.layers[first].to(h.device)
    steered_last = where is None or T - 1 in where
    expected = torch.stack([v * (s if steered_last else 0.0) for s in scales])  # (B, d)
    diff = float(((h - h[clean]) - expected).abs().max())
    bound = rtol * max(1.0, float(h.abs().max()), float(expected.abs().max()))
    with torch.inference_mode():
        lens = lm.parts.project(out.cap.resid_last[-1].to(lm.dtype)).float()  # (B, V)
    gap = float((lens - out.logits).abs().max())
    lens_bound = rtol * max(1.0, float(out.logits.abs().max()))
    what = "scale × v" if steered_last else "0 (the last position is not steered)"
    return [
        Check(name=f"after block {first}, steered − clean stream at the last position = {what}",
              value=diff, tolerance=f"≤ {rtol:g}·max(1, |x|) = {bound:.3g}", ok=diff <= bound,
              target="steered_stream"),
        Check(name="the logit lens of the last block = the model's logits, every row",
              value=gap, tolerance=f"≤ {rtol:g}·max(1, |logits|) = {lens_bound:.3g}",
              ok=gap <= lens_bound, target="lens_logits"),
    ]


def _until(tokens: list[int], eos: set[int]) -> list[int]:
    """The tokens up to and including the first end-of-text token."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1]
    return tokens


def _notes(lm: LoadedModel, vec: SteeringVector, where: tuple[int, ...] | None,
           scales: Sequence[float]) -> list[str]:
    notes = base_notes(lm)
    if vec.source == "file" and vec.path and vec.path.lower().endswith(".gguf"):
        notes.append(STEER_GGUF_BLOCKS(file=os.path.basename(vec.path),
                                       blocks=", ".join(str(k) for k in sorted(vec.layers))))
    if where is not None:
        notes.append(STEER_POSITIONS(positions=", ".join(str(p) for p in where)))
    if 0 in vec.layers:
        notes.append(STEER_BLOCK0())
    return notes
