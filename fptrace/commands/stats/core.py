"""`fptrace stats`: what the activations look like over many prompts.

One streaming pass over the prompts (the inputs of `batch`, a group of prompts per forward pass,
core/prompt_groups.py) fills an ActivationStats (core/activation_stats.py): per layer, the
per-channel statistics of the residual stream and of every linear layer's input, the massive
activations and the attention each head gives the first positions. Memory does not grow with
the number of prompts: every group's statistics are merged into the running ones and dropped.
A prompt that fails (too long, NaN) is listed, not counted.

The statistics file (`--out`) is the whole result as JSON, rewritten atomically every
`checkpoint_every` seconds and at the end: an interrupted or killed run continues with
`--resume`, and gives what one uninterrupted pass gives. With `--ray`, shards of the prompts are
counted on the cluster's actors (models/ray_pool.py, as `batch --ray`) and merged here in input
order. `merge_files` merges statistics files exactly; `save_scales` writes SmoothQuant's
activation scales.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fptrace.commands.stats.findings import (
    OUTLIER_LAYERS,
    OUTLIER_MIN,
    OUTLIER_POSITIONS,
    SINK_THRESHOLD,
    expert_loads,
    massive_activations,
    outlier_dimensions,
    sink_heads,
    top_channels,
)
from fptrace.commands.stats.result import Stats, StatsSettings
from fptrace.core.activation_stats import ActivationStats, FailedPrompt, read_statistics
from fptrace.core.inputs import PromptItem, prompt_from_json, prompt_to_json, read_inputs
from fptrace.core.prompt_groups import Failure, Summary, run_groups, sigterm_interrupts
from fptrace.errors import BadInput, param
from fptrace.results import ModelInfo

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

TOP = 3


def new_statistics(lm: LoadedModel, sinks: bool = True) -> ActivationStats:
    from fptrace.core.routing import moe_facts, routers
    from fptrace.families.parts import dims

    dm = dims(lm.config, lm.parts.family)
    moe = moe_facts(lm.parts, lm.config)
    blocks = tuple(i for i, _ in routers(lm.parts)) if moe is not None else ()
    return ActivationStats(len(lm.parts.blocks), dm.n_heads, sinks=sinks, moe_blocks=blocks,
                           n_experts=moe.n_experts if moe is not None else 0)


def build(stats: ActivationStats, model: ModelInfo, *, sink_threshold: float = SINK_THRESHOLD,
          top: int = TOP, weights: str | None = None) -> Stats:
    """The result: the findings drawn from the statistics, and the statistics."""
    from fptrace.commands.stats.notes import STATS_EAGER, STATS_FAILED, STATS_RANDOM

    settings = StatsSettings(
        massive_min=stats.massive_min, massive_ratio=stats.massive_ratio,
        outlier_min=OUTLIER_MIN, outlier_positions=OUTLIER_POSITIONS,
        outlier_layers=OUTLIER_LAYERS, sink_threshold=sink_threshold,
        sink_positions=stats.sink_positions, top=top)
    notes = [STATS_RANDOM()] if model.random_weights else []
    if stats.failed:
        notes.append(STATS_FAILED(n=len(stats.failed)))
    if stats.sinks:
        notes.append(STATS_EAGER())
    return Stats(model=model, settings=settings, prompts=len(stats.prompts),
                 failed=len(stats.failed), tokens=stats.tokens,
                 massive=massive_activations(stats), outliers=outlier_dimensions(stats),
                 top_channels=top_channels(stats, top),
                 sink_heads=sink_heads(stats, sink_threshold), notes=tuple(notes),
                 statistics=stats.to_record(), weights=weights,
                 experts=expert_loads(stats))


def model_of(doc: dict) -> ModelInfo:
    """The ModelInfo a statistics file was made with."""
    d = doc.get("model") or {}
    known = {f.name for f in dataclasses.fields(ModelInfo)}
    try:
        return ModelInfo(**{k: v for k, v in d.items() if k in known})
    except TypeError as e:
        raise BadInput(f"the statistics file's model is incomplete ({e})") from None


# ---- counting -------------------------------------------------------------------------------

def collect(lm: LoadedModel, items: Sequence[PromptItem], stats: ActivationStats, *,
            batch_size: int = 8, truncate: bool = False,
            progress: Callable[[int, int], None] | None = None,
            after_group: Callable[[ActivationStats], None] | None = None) -> Summary:
    """Count every item not yet in stats, here: each group's statistics merged into stats in
    input order (after_group(stats) after each); a failing prompt listed in stats.failed."""
    import contextlib

    from fptrace.commands.stats.collect import Collector
    from fptrace.core.hooks import eager_attention

    done = stats.done_ids()
    todo = [it for it in items if it.id not in done]
    s = Summary(total=len(items), skipped=len(items) - len(todo))
    collector = Collector(lm, stats)

    def emit(chunk: list[PromptItem], results: list[ActivationStats],
             failures: dict[str, Failure]) -> None:
        for r in results:
            stats.merge_(r)
        stats.failed += [FailedPrompt(id=f.item.id, source=f.item.source, error=f.error,
                                      error_type=f.error_type)
                         for f in (failures[it.id] for it in chunk if it.id in failures)]
        if after_group is not None:
            after_group(stats)

    with eager_attention(lm.model) if stats.sinks else contextlib.nullcontext():
        run_groups(lm, todo, collector.run, emit, summary=s, batch_size=batch_size,
                   truncate=truncate, progress=progress)
    stats.name_tokens(lm.token_text)
    return s


def count_block(lm: LoadedModel, block: dict, *, batch_size: int, truncate: bool,
                sinks: bool) -> dict:
    """On a Ray actor: the statistics of one shard of prompts (see collect_on_ray), and the
    model's facts, both as JSON (what a statistics file holds: no pickle crosses the cluster)."""
    import json

    from fptrace.core.trace import model_info
    from fptrace.render.json import to_dict, to_json

    items = [PromptItem(id=i, source=s, prompt=prompt_from_json(p), error=err or None)
             for i, s, p, err in zip(block["id"], block["source"], block["prompt"],
                                     block["error"])]
    stats = new_statistics(lm, sinks)
    s = collect(lm, items, stats, batch_size=batch_size, truncate=truncate)
    return {"state": [to_json(stats.to_record(), indent=None)], "traced": [s.traced], "failed": [s.failed],
            "tokens": [s.tokens], "prompts": [len(items)],
            "model": [json.dumps(to_dict(model_info(lm)))]}


def collect_on_ray(items: Sequence[PromptItem], stats: ActivationStats, *, address: str,
                   workers: int, gpus_per_worker: float | None, load: dict, batch_size: int,
                   truncate: bool, progress: Callable[[int, int], None] | None = None,
                   after_group: Callable[[ActivationStats], None] | None = None,
                   on_model: Callable[[ModelInfo], None] | None = None) -> Summary:
    """Count every item not yet in stats on a Ray cluster: shards of the prompts, a few per
    worker, each counted by an actor; their statistics merged into stats in input order.
    on_model(info) gets the model's facts from each shard's actor before its merge."""
    import json

    from fptrace.jsontext import loads
    from fptrace.models.ray_pool import ray_map

    done = stats.done_ids()
    todo = [it for it in items if it.id not in done]
    s = Summary(total=len(items), skipped=len(items) - len(todo))
    rows = [{"id": it.id, "source": it.source, "prompt": prompt_to_json(it.prompt),
             "error": it.error or ""} for it in todo]
    shard = max(batch_size, -(-len(todo) // (4 * max(workers, 1))))  # ~4 shards per worker
    start = time.perf_counter()
    try:
        for block in ray_map(rows, count_block, address=address, workers=workers,
                             gpus_per_worker=gpus_per_worker, load=load,
                             settings={"batch_size": batch_size, "truncate": truncate,
                                       "sinks": stats.sinks},
                             rows_per_call=shard,
                             kept=lambda: f"the {len(stats.done_ids())} prompts merged so far "
                                          "are kept: rerun with --resume to finish the rest"):
            if on_model is not None:
                on_model(model_of({"model": json.loads(block["model"][0])}))
            stats.merge_(ActivationStats.from_dict(loads(block["state"][0]),
                                                   where="a Ray worker's statistics"))
            s.traced += int(block["traced"][0])
            s.failed += int(block["failed"][0])
            s.tokens += int(block["tokens"][0])
            if after_group is not None:
                after_group(stats)
            if progress is not None:
                progress(int(block["prompts"][0]), int(block["tokens"][0]))
    except KeyboardInterrupt:
        s.interrupted = True
    finally:
        s.seconds = time.perf_counter() - start
    return s


def activation_stats(lm: LoadedModel, prompts: Sequence[str], *, batch_size: int = 8,
                     truncate: bool = False, sinks: bool = True,
                     sink_threshold: float = SINK_THRESHOLD, top: int = TOP) -> Stats:
    """The statistics `fptrace stats` computes, of a list of prompts (their ids p:1, p:2, ...;
    a prompt that cannot be counted is listed in `statistics.failed`)."""
    from fptrace.core.trace import model_info

    items = [PromptItem(f"p:{i + 1}", p, f"prompts[{i}]") for i, p in enumerate(prompts)]
    stats = new_statistics(lm, sinks)
    collect(lm, items, stats, batch_size=batch_size, truncate=truncate)
    return build(stats, model_info(lm), sink_threshold=sink_threshold, top=top)


# ---- the command's work: files in, a statistics file out -------------------------------------

def stats_run(inputs: Sequence[str], *, out: str | None, resume: bool, force: bool,
              load: Callable[[], LoadedModel], model_name: str, random_weights: bool,
              sinks: bool = True, batch_size: int = 8, truncate: bool = False,
              checkpoint_every: float = 60.0,
              sink_threshold: float = SINK_THRESHOLD, top: int = TOP,
              progress: Callable[[int], Any] | None = None,
              elsewhere: Callable[..., Summary] | None = None,
              shape: Callable[[], tuple[int, int]] | None = None) -> tuple[Stats, Summary]:
    """All of `fptrace stats INPUTS`: read the inputs; check --out (an existing file needs
    --resume, or --force to start over, and must be a statistics file either way); load the
    model only when something is left to do; count, writing --out every checkpoint_every seconds
    and at the end (also when interrupted). elsewhere: counts somewhere else instead of here
    (`--ray`: collect_on_ray with its cluster settings bound; shape() then gives the model's
    (layers, heads) from its config, and the actors its other facts)."""
    import contextlib

    from fptrace.atomic import check_target
    from fptrace.locks import exclusive

    items = read_inputs(inputs, exclude=out)
    guard = contextlib.ExitStack()
    if out is not None:  # one run writes an --out at a time: a second is refused, naming it
        check_target(out, "--out", "stats.json", force=True)
        guard.enter_context(exclusive(out, "stats"))
    with guard:
        return _counted(items, out=out, resume=resume, force=force, load=load,
                        model_name=model_name, random_weights=random_weights, sinks=sinks,
                        batch_size=batch_size, truncate=truncate,
                        checkpoint_every=checkpoint_every, sink_threshold=sink_threshold,
                        top=top, progress=progress, elsewhere=elsewhere, shape=shape)


def _counted(items: list, *, out: str | None, resume: bool, force: bool,
             load: Callable[[], LoadedModel], model_name: str, random_weights: bool, sinks: bool,
             batch_size: int, truncate: bool, checkpoint_every: float, sink_threshold: float,
             top: int, progress: Callable[[int], Any] | None,
             elsewhere: Callable[..., Summary] | None,
             shape: Callable[[], tuple[int, int]] | None) -> tuple[Stats, Summary]:
    """stats_run once the inputs are read and --out is held."""
    import contextlib

    stats, doc = _previous(out, resume, force, model_name, random_weights, sinks)
    todo = len(items) if stats is None else \
        sum(1 for it in items if it.id not in stats.done_ids())
    if todo == 0 and stats is not None:
        return build(stats, model_of(doc), sink_threshold=sink_threshold, top=top,
                     weights=doc.get("weights")), Summary(total=len(items), skipped=len(items))
    lm = load() if elsewhere is None else None
    model: list[ModelInfo] = []  # the loaded model's facts, once known
    weights = None if lm is None else _same_weights(lm, doc, out, model_name, random_weights)
    if lm is None and doc is not None:  # counted on a cluster: no fingerprint here, the name
        _same_name(doc, out, model_name, random_weights)

    def know(info: ModelInfo) -> None:
        if doc is not None and doc["model"].get("dtype") != info.dtype:
            raise BadInput(f"{param('out')} {out} holds statistics made in "
                           f"{doc['model'].get('dtype')}, "
                           f"this run computes in {info.dtype}: pass the same {param('dtype')}, or "
                           f"choose another {param('out')}")
        if not model:
            model.append(info)

    if lm is not None:
        from fptrace.core.trace import model_info

        know(model_info(lm))
        stats = stats or new_statistics(lm, sinks)
    elif stats is None:
        if shape is None:
            raise BadInput("counting elsewhere needs the model's shape")
        layers, heads = shape()
        stats = ActivationStats(layers, heads, sinks=sinks)
    last = [time.monotonic()]

    def checkpoint(st: ActivationStats) -> None:
        if out is not None and model and time.monotonic() - last[0] >= checkpoint_every:
            if lm is not None:
                st.name_tokens(lm.token_text)
            write_stats(out, build(st, model[0], sink_threshold=sink_threshold, top=top,
                                   weights=weights))
            last[0] = time.monotonic()

    bar = progress(todo) if progress is not None else contextlib.nullcontext(None)
    with sigterm_interrupts(), bar as tick:
        if elsewhere is not None:
            summary = elsewhere(items, stats, batch_size=batch_size, truncate=truncate,
                                progress=tick, after_group=checkpoint, on_model=know)
        else:
            assert lm is not None  # loaded: nothing counts elsewhere
            summary = collect(lm, items, stats, batch_size=batch_size, truncate=truncate,
                              progress=tick, after_group=checkpoint)
    if lm is not None:
        stats.name_tokens(lm.token_text)
    info = model[0] if model else model_of(doc) if doc is not None else None
    if info is None:  # interrupted on a cluster before any shard came back
        return None, summary  # type: ignore[return-value]
    result = build(stats, info, sink_threshold=sink_threshold, top=top, weights=weights)
    if out is not None:
        write_stats(out, result)
    return result, summary


def _same_weights(lm: LoadedModel, doc: dict | None, out: str | None, model_name: str,
                  random_weights: bool) -> str | None:
    """The loaded model's fingerprint; when resuming a file that has one, it must be the same:
    other weights under the same name are refused, the same weights under another name or
    path are accepted (files without a fingerprint were checked by name in _previous)."""
    from fptrace.models.fingerprint import weights_fingerprint

    weights = weights_fingerprint(lm)
    was = doc.get("weights") if doc is not None else None
    if was is not None and weights is not None and was != weights:
        m = doc["model"]
        raise BadInput(f"{param('out')} {out} holds statistics of {_model_text(m)} with weights "
                       f"{was}, "
                       f"this run loads {model_name}" + (" (random weights)" if random_weights
                                                         else "")
                       + f" with weights {weights}: other weights, whatever the name; resume "
                       f"with the same model, or choose another {param('out')}")
    if was is not None and weights is None:
        _same_name(doc, out, model_name, random_weights)
    return weights


def _previous(out: str | None, resume: bool, force: bool, model_name: str,
              random_weights: bool, sinks: bool) -> tuple[ActivationStats | None, dict | None]:
    """The statistics an existing --out holds, when resuming; None when starting afresh."""
    from fptrace.atomic import check_target

    if out is None:
        if resume:
            raise BadInput(f"{param('resume')} continues an {param('out')} file: give "
                           f"{param('out')}")
        return None, None
    check_target(out, "--out", "stats.json", force=True)  # whose file it is: read_statistics
    if not os.path.exists(out):
        return None, None
    doc, stats = read_statistics(out)  # first of all: never touch a file of something else
    if not (resume or force):
        raise BadInput(f"{param('out')} {out} exists: pass {param('resume')} to continue it, "
                       f"{param('force')} to start over, "
                       f"or choose another {param('out')}")
    if force:
        return None, None
    if doc.get("weights") is None or \
            bool(doc.get("model", {}).get("random_weights")) != random_weights:
        _same_name(doc, out, model_name, random_weights)  # the weights compared once loaded
    if stats.sinks != sinks:
        raise BadInput(f"{param('out')} {out} was made {'with' if stats.sinks else 'without'} "
                       f"attention "
                       f"sinks: resume with the same {param('sinks')}/{param('no_sinks')}")
    return stats, doc


def _same_name(doc: dict, out: str | None, model_name: str, random_weights: bool) -> None:
    was = doc.get("model", {})
    if (was.get("name"), bool(was.get("random_weights"))) != (model_name, random_weights):
        raise BadInput(f"{param('out')} {out} holds statistics of {was.get('name')}"
                       + (" (random weights)" if was.get("random_weights") else "")
                       + f", not of {model_name}" + (" (random weights)" if random_weights
                                                     else "")
                       + f": resume with the same model, or choose another {param('out')}")


def write_stats(path: str, result: Stats) -> None:
    """The statistics file: the whole result as compact JSON, written atomically."""
    from fptrace.atomic import write_text_atomic
    from fptrace.render.json import to_json

    write_text_atomic(path, to_json(result, indent=None) + "\n", ".json")


def merge_files(paths: Sequence[str], *, sink_threshold: float = SINK_THRESHOLD,
                top: int = TOP) -> Stats:
    """Statistics files merged in the order given: what one pass over their prompts in that
    order gives. Files of different models, dtypes or settings are refused, naming both."""
    if not paths:
        raise BadInput(f"{param('merge')} needs statistics files (.json written by `fptrace stats "
                       f"{param('out')}`)")
    docs = []
    for p in paths:
        doc, st = read_statistics(p)
        docs.append((p, doc, st))
    first_path, first_doc, total = docs[0]
    m0, w0 = first_doc.get("model", {}), first_doc.get("weights")
    for p, doc, st in docs[1:]:
        m, w = doc.get("model", {}), doc.get("weights")
        if w0 is not None and w is not None and w != w0:
            raise BadInput(f"{first_path} holds statistics of {_model_text(m0)} with weights "
                           f"{w0}, {p} of {_model_text(m)} with weights {w}: only statistics "
                           "of one model merge (the same weights, whatever their name)")
        same = w0 is not None and w == w0  # the same tensors under another name or path
        keys = (("dtype", "dtype"),) if same else (
            ("name", "model"), ("random_weights", "weights"), ("dtype", "dtype"))
        for key, what in keys:
            if m.get(key) != m0.get(key):
                raise BadInput(f"{first_path} holds statistics of {_model_text(m0)}, {p} of "
                               f"{_model_text(m)}: only statistics of one model (same weights "
                               f"and dtype) merge (the {what} differs)")
        total.merge_(st, names=(first_path if total is docs[0][2] else "the files before",
                                p))
    return build(total, model_of(first_doc), sink_threshold=sink_threshold, top=top,
                 weights=w0 if all(d.get("weights") == w0 for _, d, _ in docs) else None)


def _model_text(m: dict) -> str:
    return f"{m.get('name')}" + (" (random weights)" if m.get("random_weights") else "") + \
        f" in {m.get('dtype')}"


def save_scales(result: Stats, path: str) -> int:
    """SmoothQuant's activation scales: for every linear layer, the largest |x| of each channel
    of its input, keyed by the layer's full module name (as generate_act_scales.py keys them),
    float32, written atomically as safetensors. Returns how many tensors were written."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from fptrace.atomic import write_atomic

    st = result.statistics
    tensors = {}
    sites = [s for layer in st.layers for s in layer.sites] + \
        ([st.final] if st.final is not None else [])
    for s in sites:
        if s.channels.count == 0:
            continue
        scale = torch.from_numpy(np.asarray(s.channels.absmax, dtype=np.float32))
        for name in s.modules:
            tensors[name] = scale.clone()
    if not tensors:
        raise BadInput("no prompt was counted: there are no activation scales to save")
    from fptrace.atomic import MARK

    meta = {"format": "pt", "producer": f"{MARK} stats", "model": result.model.name,
            "prompts": str(result.prompts), "tokens": str(result.tokens)}
    write_atomic(path, lambda tmp: save_file(tensors, tmp, metadata=meta), ".safetensors")
    return len(tensors)


def check_scales_path(path: str, force: bool = False) -> None:
    from fptrace.atomic import check_target

    check_target(path, "--save-scales", "act_scales.safetensors", force)
    if not path.endswith(".safetensors"):
        raise BadInput(f"{param('save_scales')} {path}: the scales are written as safetensors; "
                       f"name the "
                       "file *.safetensors")


__all__ = [
    "activation_stats",
    "build",
    "check_scales_path",
    "collect",
    "collect_on_ray",
    "count_block",
    "merge_files",
    "new_statistics",
    "save_scales",
    "stats_run",
    "write_stats",
]
