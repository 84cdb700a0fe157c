"""`fptrace diff PROMPT -m MODEL.gguf --engine-b llama.cpp`: transformers (a) against llama.cpp
(b) on the same GGUF file.

Token ids first: llama.cpp's tokenizer against transformers'; where they split the prompt
differently the difference is named and llama.cpp runs transformers' ids, so the streams are
compared position for position. Then the plain diff, block by block, of the two traces (the
llama.cpp trace is `run --engine llama.cpp`'s), and with --deep, inside each block, every point
llama.cpp's graph names (the family's llama.cpp names) against the same point recorded in
transformers, with the first point that parts beyond the tolerance: the comparison code of
`diff --deep` (compare_block, parting, lens_rows) on both sides' tensors.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from fptrace.addresses import Selection, resolve_selection
from fptrace.commands.diff.core import diff
from fptrace.commands.diff.deep import RECOMPUTED, compare_block, lens, lens_rows, parting, record
from fptrace.commands.diff.emulation import emulating
from fptrace.commands.diff.result import DeepDiff, Emulation, EmulationRung, TraceDiff
from fptrace.core.llamacpp_trace import block_points, llamacpp_trace, names_for, run_llamacpp
from fptrace.families.parts import dims
from fptrace.models.llamacpp import emulate as E
from fptrace.models.llamacpp.engine import EngineOptions
from fptrace.models.loading import LoadedModel
from fptrace.points import BLOCK, Point

LABELS = ("transformers", "llama.cpp")


def engine_diff(lm: LoadedModel, path: str, prompt: str | Sequence[int], *,
                options: EngineOptions | None = None,
                deep: bool = False, layers: Sequence[int] | Selection | None = None,
                tolerance: float | None = None, name_b: str | None = None,
                emulate: Sequence[str] = ()) -> TraceDiff:
    """Compare transformers' pass of `lm` with llama.cpp's pass of the GGUF at `path` (the same
    file, or with --model-b another GGUF of the same shape: a modified copy, say). emulate:
    llama.cpp's numerics put on the transformers side (models/llamacpp/emulate.py's STEPS, in
    ladder order): the comparison has them all on, and `emulation` gives the per-block error
    with none, then each one added in turn."""
    import torch

    options = options or EngineOptions()
    ids = lm.encode(prompt)
    if isinstance(prompt, str):  # llama.cpp tokenizes it too, and its ids are compared
        lm_pass = run_llamacpp(path, prompt, options, ids=ids)
    else:  # ids given (--ids): both engines run exactly these
        lm_pass = dataclasses.replace(run_llamacpp(path, "", options, ids=ids),
                                      prompt=lm.prompt_text(prompt))
    names = names_for(lm_pass)
    d = int(lm.config.hidden_size)
    trace_b, _ = llamacpp_trace(lm, lm_pass, snippet=d, given_ids=True)
    if name_b is not None:  # another file: its name, so that the diff says the models differ
        trace_b = dataclasses.replace(trace_b, model=dataclasses.replace(trace_b.model,
                                                                        name=name_b))
    fam = lm.parts.family
    dm = dims(lm.config, fam)
    n = len(lm.parts.blocks)
    chosen = (resolve_selection(layers, n, "layers", lm.name, "block") or tuple(range(n))) \
        if deep else ()
    steps = tuple(emulate)
    flash = options.flash_attn != "off"
    with emulating(lm, path, steps, cache=options.cache_type, flash=flash) as attention:
        trace_a, lens_a, recorded = record(lm, ids, chosen, attention=attention or "eager")
    base = diff(trace_a, trace_b, labels=LABELS, tolerance=tolerance, same_input=True)
    notes = tuple(n for n in trace_b.notes if n not in base.notes)
    base = dataclasses.replace(base, notes=base.notes + notes)
    if steps:
        base = dataclasses.replace(base, emulation=ladder_of(lm, path, ids, trace_b, base, steps,
                                                             options, lm_pass))
    if not deep:
        return base
    order = tuple(p for p in BLOCK if p == Point.resid_pre or p in names.points)
    blocks = []
    last: dict = {}
    with torch.inference_mode():
        for layer in chosen:
            pb = {p: torch.from_numpy(x)[None] for p, x in
                  block_points(lm_pass, names, layer, dm.n_heads, dm.n_kv_heads).items()}
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
        parted=parting(blocks, base.tolerance), notes=())
    return dataclasses.replace(base, deep=deep_result,
                               within=base.within and deep_result.parted is None)


def blocks_alone(lm: LoadedModel, lm_pass: Any) -> list[float] | None:
    """Each block of `lm` fed llama.cpp's own input (its `l_out` of the block before, `embd` for
    block 0): the relative difference of its output to llama.cpp's `l_out`, over every
    position; None when the model's rotary embedding is not where a Llama keeps it."""
    import numpy as np
    import torch

    from fptrace.core.llamacpp_trace import squeeze

    rotary = getattr(getattr(lm.model, "model", None), "rotary_emb", None)
    if rotary is None:
        return None
    T = len(lm_pass.ids)
    pos = torch.arange(T, device=lm.device)[None]
    # causal, given explicitly: an eager attention reads no mask as "every key"
    mask = torch.full((T, T), float("-inf"), device=lm.device, dtype=lm.dtype).triu(1)[None, None]
    out = []
    with torch.inference_mode():
        for k, blk in enumerate(lm.parts.blocks):
            src = "embd" if k == 0 else f"l_out-{k - 1}"
            x = torch.from_numpy(squeeze(lm_pass.tensors[src], 2).copy())[None]
            x = x.to(lm.device, lm.dtype)
            y = blk(x, attention_mask=mask, position_embeddings=rotary(x, pos),
                    position_ids=pos)
            y = (y[0] if isinstance(y, tuple) else y)[0].float().cpu().numpy()
            want = squeeze(lm_pass.tensors[f"l_out-{k}"], 2)
            scale = float(np.linalg.norm(y))
            diff_ = float(np.linalg.norm(y.astype(np.float64) - want))
            out.append(diff_ / scale if scale > 0 else 0.0)
    return out


def ladder_of(lm: LoadedModel, path: str, ids: list[int], trace_b: Any, full: TraceDiff,
              steps: Sequence[str], options: EngineOptions, lm_pass: Any) -> Emulation:
    """The per-block error to llama.cpp's trace_b with no step on, then each added in turn (the
    last rung is `full`, the comparison with every step on), and the error each block adds on
    its own (fed llama.cpp's input)."""
    from fptrace.core.trace import run_trace

    d = int(lm.config.hidden_size)
    flash = options.flash_attn != "off"
    rungs = []
    for on in E.ladder(steps):
        with emulating(lm, path, on, cache=options.cache_type, flash=flash):
            if len(on) == len(steps):
                rows = full.layers
            else:
                trace_a = run_trace(lm, ids, snippet=d)
                rows = diff(trace_a, trace_b, labels=LABELS, same_input=True).layers
            alone = blocks_alone(lm, lm_pass) or []
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

    return Emulation(steps=tuple(steps), cache=options.cache_type,
                     kernel="flash" if flash else "plain", rungs=tuple(rungs),
                     fall=fall(rungs[0].worst, rungs[-1].worst),
                     fall_alone=fall(rungs[0].alone_worst, rungs[-1].alone_worst))


def check_combination(second: Any, settings_b: dict) -> str | None:
    """Why --engine-b llama.cpp cannot go with what else was given, or None (--model-b names
    the GGUF llama.cpp runs, when it is not the same file)."""
    if second is not None:
        return "--engine-b llama.cpp compares one prompt on two engines: give one PROMPT"
    if set(settings_b) - {"model"}:
        return ("--engine-b llama.cpp runs a GGUF in llama.cpp: give it without "
                "--dtype-b/--device-b/--quantize-b/--random-weights-b")
    return None




def from_cli(first: str | None, second: str | None, opts: Any, chat: Any, settings_b: dict, *,
             flash_attn: str, kv_cache: str, deep: bool, layers: Selection | None,
             tolerance: float | None, emulate: Sequence[str] = ()) -> TraceDiff:
    """The checks that cost nothing (the combination, the prompt, the file, the library), then
    the load and the comparison."""
    from fptrace.cli.io import load, prompt_of, said_of_ids
    from fptrace.core.llamacpp_trace import gguf_path
    from fptrace.errors import BadInput
    from fptrace.models.llamacpp.binding import load as load_library

    why = check_combination(second, settings_b)
    if why is None and (chat.chat or chat.system is not None or chat.messages is not None):
        why = "--engine-b llama.cpp takes a text PROMPT, not --chat/--system/--messages"
    if why is not None:
        raise BadInput(why)
    prompt = prompt_of(first, chat)
    gguf_path(opts.model)  # side a is a GGUF too: the same checkpoint in transformers
    path = gguf_path(settings_b.get("model", opts.model))
    load_library()
    lm = load(opts)
    if isinstance(prompt, tuple):  # --ids: checked against the vocabulary, retokenizing said
        said_of_ids(lm, prompt)
    return engine_diff(lm, path, prompt,
                       options=EngineOptions(flash_attn=flash_attn, cache_type=kv_cache),
                       deep=deep, layers=layers, tolerance=tolerance,
                       name_b=settings_b.get("model"), emulate=emulate)


__all__ = ["LABELS", "blocks_alone", "check_combination", "engine_diff", "from_cli", "ladder_of"]
