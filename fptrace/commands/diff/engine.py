"""`fptrace diff PROMPT -m FILE --engine-b ENGINE`: transformers (a) against another engine (b)
on the same file, llama.cpp's GGUF say (fptrace/engines/).

The engine runs its pass of the prompt (an EnginePass: where its tokenizer splits the prompt
otherwise, it says so and runs transformers' ids, so the streams are compared position for
position). Then the plain diff, block by block, of the two traces, and with --deep, inside each
block, every point the engine's pass names against the same point recorded in transformers, with
the first point that parts beyond the tolerance: the comparison code of `diff --deep`
(compare_block, parting, lens_rows) on both sides' tensors. With --emulate, the engine's
numerics are put on transformers' side step by step (its Emulation), and each rung measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from fptrace.addresses import Selection, resolve_selection
from fptrace.commands.diff.core import diff
from fptrace.commands.diff.deep import RECOMPUTED, compare_block, lens, lens_rows, parting, record
from fptrace.commands.diff.result import DeepDiff, Emulation, EmulationRung, TraceDiff
from fptrace.engines import Engine, EnginePass, SideB, default
from fptrace.errors import BadInput, param
from fptrace.families.kinds import PositionKind
from fptrace.families.parts import dims
from fptrace.models.loading import LoadedModel
from fptrace.points import BLOCK, Point


def labels(engine: Engine) -> tuple[str, str]:
    """The two sides' labels: the default engine's name, then `engine`'s."""
    return default().name, engine.name


def engine_diff(lm: LoadedModel, engine: Engine, path: str, prompt: str | Sequence[int], *,
                settings: Mapping[str, str] | None = None,
                deep: bool = False, layers: Sequence[int] | Selection | None = None,
                tolerance: float | None = None, name_b: str | None = None,
                emulate: Sequence[str] = ()) -> TraceDiff:
    """Compare transformers' pass of `lm` with `engine`'s pass of the file at `path` (the same
    file, or with --model-b another of the same shape: a modified copy, say). settings: the
    engine's settings (Setting.name -> word; its defaults where absent). emulate: the engine's
    numerics put on the transformers side (its Emulation's steps, in ladder order): the
    comparison has them all on, and `emulation` gives the per-block error with none, then each
    one added in turn."""
    import torch

    if engine.compare is None:
        raise BadInput(f"the {engine.name} engine does not compare with transformers")
    settings = dict(settings or {})
    steps = tuple(emulate)
    if steps and engine.emulation is None:
        raise BadInput(f"{param('emulate')}: the {engine.name} engine's numerics cannot be "
                       f"emulated")
    ids = lm.encode(prompt)
    side_b = engine.compare.run_pass(lm, path, prompt, settings)
    trace_b = side_b.trace
    if name_b is not None:  # another file: its name, so that the diff says the models differ
        trace_b = dataclasses.replace(trace_b, model=dataclasses.replace(trace_b.model,
                                                                        name=name_b))
    fam = lm.parts.family
    dm = dims(lm.config, fam)
    n = len(lm.parts.blocks)
    chosen = (resolve_selection(layers, n, "layers", lm.name, "block") or tuple(range(n))) \
        if deep else ()
    emulated = engine.emulation.emulating(lm, path, steps, settings) \
        if steps and engine.emulation is not None else contextlib.nullcontext(None)
    with emulated as attention:
        trace_a, lens_a, recorded = record(lm, ids, chosen, attention=attention or "eager")
    base = diff(trace_a, trace_b, labels=labels(engine), tolerance=tolerance, same_input=True)
    notes = tuple(n for n in trace_b.notes if n not in base.notes)
    base = dataclasses.replace(base, notes=base.notes + notes)
    if steps:
        base = dataclasses.replace(base, emulation=ladder_of(lm, engine, path, ids, trace_b,
                                                             base, steps, settings, side_b))
    if not deep:
        return base
    order = tuple(p for p in BLOCK if p == Point.resid_pre or p in side_b.points)
    blocks = []
    last: dict = {}
    with torch.inference_mode():
        for layer in chosen:
            pb = {p: torch.from_numpy(x)[None] for p, x in
                  side_b.block(layer, dm.n_heads, dm.n_kv_heads).items()}
            pa = recorded[layer]
            upstream = 0.0 if layer == 0 else last.get(layer - 1)
            blk = compare_block(layer, pa, pb, order, lm.parts.parallel_residual, dm.n_heads,
                                upstream)
            last[layer] = next((p.rel for p in blk.points if p.point == Point.resid_post.value),
                               None)
            blocks.append(blk)
    deep_result = DeepDiff(
        family_a=fam.name, family_b=fam.name, compared=True, layers=chosen,
        points=tuple(p.value for p in order),
        recomputed=tuple(p.value for p in RECOMPUTED if p in order), tolerance=base.tolerance,
        blocks=tuple(blocks), lens=lens_rows(trace_a, lens_a, lens(lm, trace_b)),
        parted=parting(blocks, base.tolerance, fam.positions is PositionKind.rope), notes=())
    return dataclasses.replace(base, deep=deep_result,
                               within=base.within and deep_result.parted is None)


def blocks_alone(lm: LoadedModel, side_b: EnginePass) -> list[float] | None:
    """Each block of `lm` fed the other engine's own input (its output of the block before, its
    embedding for block 0): the relative difference of its output to the engine's, over every
    position; None when the model's rotary embedding is not where a Llama keeps it."""
    import numpy as np
    import torch

    rotary = getattr(getattr(lm.model, "model", None), "rotary_emb", None)
    if rotary is None:
        return None
    T = int(side_b.stream(-1).shape[0])
    pos = torch.arange(T, device=lm.device)[None]
    # causal, given explicitly: an eager attention reads no mask as "every key"
    mask = torch.full((T, T), float("-inf"), device=lm.device, dtype=lm.dtype).triu(1)[None, None]
    out = []
    with torch.inference_mode():
        for k, blk in enumerate(lm.parts.blocks):
            x = torch.from_numpy(side_b.stream(k - 1).copy())[None]
            x = x.to(lm.device, lm.dtype)
            y = blk(x, attention_mask=mask, position_embeddings=rotary(x, pos),
                    position_ids=pos)
            y = (y[0] if isinstance(y, tuple) else y)[0].float().cpu().numpy()
            want = side_b.stream(k)
            scale = float(np.linalg.norm(y))
            diff_ = float(np.linalg.norm(y.astype(np.float64) - want))
            out.append(diff_ / scale if scale > 0 else 0.0)
    return out


def ladder_of(lm: LoadedModel, engine: Engine, path: str, ids: list[int], trace_b: Any,
              full: TraceDiff, steps: Sequence[str], settings: Mapping[str, str],
              side_b: EnginePass) -> Emulation:
    """The per-block error to the engine's trace_b with no step on, then each added in turn (the
    last rung is `full`, the comparison with every step on), and the error each block adds on
    its own (fed the engine's input)."""
    from fptrace.core.trace import run_trace

    emulation = engine.emulation
    assert emulation is not None  # engine_diff refuses steps for an engine without one
    d = int(lm.config.hidden_size)
    rungs = []
    for on in emulation.ladder(steps):
        with emulation.emulating(lm, path, on, settings):
            if len(on) == len(steps):
                rows = full.layers
            else:
                trace_a = run_trace(lm, ids, snippet=d)
                rows = diff(trace_a, trace_b, labels=labels(engine), same_input=True).layers
            alone = blocks_alone(lm, side_b) or []
        rel = tuple(r.rel_diff for r in rows)
        blocks = [x for r, x in zip(rows, rel, strict=True)
                  if r.layer is not None and x is not None]
        rungs.append(EmulationRung(
            steps=on, label=f"+{on[-1]}" if on else "off", rel=rel,
            worst=max(blocks) if blocks else None,
            median=statistics.median(blocks) if blocks else None, alone=tuple(alone),
            alone_worst=max(alone) if alone else None,
            alone_median=statistics.median(alone) if alone else None))

    def fall(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    cache, kernel = emulation.described(settings)
    return Emulation(steps=tuple(steps), cache=cache, kernel=kernel, rungs=tuple(rungs),
                     fall=fall(rungs[0].worst, rungs[-1].worst),
                     fall_alone=fall(rungs[0].alone_worst, rungs[-1].alone_worst))


def from_cli(engine: Engine, first: str | None, second: str | None, opts: Any, chat: Any,
             settings_b: dict, *, settings: Mapping[str, str], deep: bool,
             layers: Selection | None, tolerance: float | None,
             emulate: Sequence[str] = ()) -> TraceDiff:
    """The engine's checks that cost nothing (the combination, the files, its library), the
    prompt, then the load and the comparison."""
    from fptrace.cli.io import load, prompt_of, said_of_ids

    if engine.compare is None:
        raise BadInput(f"the {engine.name} engine does not compare with transformers")
    path = engine.compare.prepare(SideB(first, second, opts, chat, settings_b))
    prompt = prompt_of(first, chat)
    lm = load(opts)
    if isinstance(prompt, tuple):  # --ids: checked against the vocabulary, retokenizing said
        said_of_ids(lm, prompt)
    return engine_diff(lm, engine, path, prompt, settings=settings, deep=deep, layers=layers,
                       tolerance=tolerance, name_b=settings_b.get("model"), emulate=emulate)


__all__ = ["blocks_alone", "engine_diff", "from_cli", "labels", "ladder_of"]
