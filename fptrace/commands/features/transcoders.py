"""`fptrace features train --transcoder --layers SEL`: one TopK transcoder per block, each
reading what the block's MLP receives (after the norm before it) and rebuilding what the MLP
adds to the stream, written in SAELens's layout and, with `--export circuit-tracer`, in
circuit-tracer's transcoder-set layout. The SAE trainer's parts are reused (train.py: the TopK
class, the step with its AuxK loss, Adam, the checkpoints and --resume, the held-out split and
evaluation); what is new is the collection, the layers and the export.

1. One collection pass over the prompts (a group of prompts a forward pass, as `features train`
   and `stats` read them) hooks every selected block's MLP module (the one hook site,
   streams.py: its input, and the output of the module whose output the stream receives) and
   writes both at every position but each prompt's first (the massive activation, left out as
   the SAE trainer leaves it out; the prompts run in order of length, so that a group pads
   little) to float32 files in the output folder,
   `activations/layer_{L}.in.f32` and `.out.f32`, the training prompts' rows then the held-out
   ones'. Memory: kept in RAM, 30 blocks × 2 × positions × d_model × 4 bytes (138 KiB a
   position on the bundled model: 13.8 GB for 100k positions) would pass what a laptop has;
   on disk, one block's rows are read back at a time (2 × positions × d × 4 bytes in RAM).
   `check_resources` refuses, before the model is loaded, a run whose RAM (the SAE trainer's
   figures plus one block's rows) passes 80% of the free memory (exit 3) or whose files would
   pass 90% of the free disk under --out (exit 74). The files are removed once every block is
   trained.
2. Block after block: a TopK transcoder, a = TopK(relu(x·W_enc + b_enc)), ŷ = a·W_dec + b_dec
   (the input is not shifted by b_dec, which lives in the output's space), trained on the FVU
   of the MLP's output ‖y − ŷ‖² / ‖y − mean y‖² (plus AuxK) with train.py's `fit`; its
   checkpoints go to `layer_{L}/`. Once trained, the held-out FVU, L0 and dead latents are
   measured, cfg.json + sae_weights.safetensors written (architecture `topk_transcoder`,
   hook_name `blocks.L.ln2.hook_normalized`, hook_name_out `blocks.L.hook_mlp_out`), the block
   recorded as done in `transcoders.json` and its checkpoint removed.
   With `--skip` (skip transcoders: Paulo, Shabalin & Belrose 2025; SAELens's SkipTranscoder,
   sparsify's skip_connection, circuit-tracer's W_skip, Gemma Scope 2's affine transcoders),
   ŷ = a·W_dec + b_dec + x·W_skip, W_skip (d, d) dense: W_skip and b_dec start as the
   least-squares affine map from x to y on the training rows (normal equations in float64,
   train.least_squares) and are trained with the rest; the held-out FVU counts the skip term.
   Measured on the bundled model (34,619 training positions, 144 steps, 2,048 latents, k 32,
   lr 2e-3; held-out FVU): block 8 0.377 without a skip, 0.308 with one started at the
   least-squares map, 0.306 started at zero; block 15 0.483, 0.314, 0.342; block 29 0.109,
   0.041, 0.050 (the least-squares map alone: 0.420, 0.350, 0.044). The L0 falls below k
   with a skip (10-18 at these blocks: fewer than k pre-activations stay positive). Written as
   architecture `topk_skip_transcoder` with W_skip (d_out, d_in), as SAELens stores it.
3. `transcoders.json` holds the run: its options, the blocks, what it was trained from (model
   name, weights fingerprint, prompts digest: a resume on anything else is refused, as train.py
   refuses it), whether the collection finished, and each finished block's figures. `--resume`
   keeps the finished blocks, reuses a finished collection (else collects again), continues the
   interrupted block from its checkpoint and trains the rest: the weights equal those of an
   uninterrupted run.
4. `--export circuit-tracer`: circuit-tracer 0.5's transcoders are ReLU or JumpReLU (its
   `load_relu_transcoder`; it has no TopK loader), so the export is the JumpReLU transcoder
   with the same weights and one threshold θ for every latent: the (M·k)-th largest
   pre-activation over M training positions, which fires k latents a position on average (the
   rule by which BatchTopK dictionaries run at inference). Its own held-out FVU and L0 are
   reported beside the TopK ones: the export is the TopK transcoder's nearest JumpReLU, not the
   TopK transcoder itself. `circuit-tracer/layer_{L}.safetensors` hold W_enc (d_sae, d_model),
   W_dec (d_sae, d_model), b_enc, b_dec, `activation_function.threshold` (d_sae,) and with
   --skip W_skip (d_model, d_model), which its compute_skip applies as x @ W_skip.T, as
   circuit-tracer's `SingleLayerTranscoder.to_safetensors` writes them; `config.yaml` names
   `model_kind: transcoder_set`, the hooks `mlp.hook_in` / `mlp.hook_out`, the model and the
   files. It needs a transcoder for every block (circuit-tracer replaces every MLP) and a
   family whose stream receives the MLP module's own output (no norm after the MLP: there
   circuit-tracer's `mlp.hook_out` is another tensor than the one trained on).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fptrace.addresses import Selection, Site
from fptrace.commands.features.result import TranscoderLayer, TranscodersResult
from fptrace.commands.features.streams import capture
from fptrace.commands.features.train import (
    STATE,
    STATE_JSON,
    TopK,
    TrainOptions,
    atomic_write,
    check_memory,
    check_options,
    check_out,
    check_source,
    estimated_positions,
    evaluate,
    fit,
    inputs_digest,
    model_sizes,
    resumed_state,
    split_held_out,
    training_bytes,
    write_saelens_folder,
)
from fptrace.core.dictionary_sites import MLP_IN, hook_name
from fptrace.core.trace import model_info
from fptrace.errors import BadInput, FptraceError, WriteFailed, param
from fptrace.points import Point

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

MANIFEST = "transcoders.json"
ACTIVATIONS = "activations"
EXPORTS = ("circuit-tracer",)
EXPORT_FOLDER = {"circuit-tracer": "circuit-tracer"}
THRESHOLD_ROWS = 16_384  # training positions the export's threshold is measured on
# the command's learning rate for transcoders (TrainOptions' 5e-4 is the SAE's): measured on
# block 15 of the bundled model, 33k positions, 128 steps, held-out FVU 0.50 at 2e-3 against
# 0.68 at 5e-4 and 0.45 at 5e-3 over 256 steps against 0.44 at 2e-3 (benchmarks/README.md)
TRANSCODER_LR = 2e-3


def layer_folder(out: str, layer: int) -> str:
    return os.path.join(out, f"layer_{layer}")


def _files(out: str, layer: int) -> dict[str, str]:
    base = os.path.join(out, ACTIVATIONS, f"layer_{layer}")
    return {"in": base + ".in.f32", "out": base + ".out.f32"}


def check_export(export: str | None, layers: Sequence[int], n_layers: int,
                 lm: LoadedModel | None = None) -> None:
    """--export's name, and what circuit-tracer's loader needs: a transcoder for every block
    and (once the model is loaded) no norm between the MLP and the stream."""
    if export is None:
        return
    if export not in EXPORTS:
        raise BadInput(f"{param('export')} {export!r}: the exports are {', '.join(EXPORTS)}")
    if tuple(layers) != tuple(range(n_layers)):
        raise BadInput(f"{param('export')} {export} needs a transcoder for every block "
                       f"(circuit-tracer "
                       f"replaces every MLP and loads layers 0 to {n_layers - 1}): give "
                       f"{param('layers')} all")
    if lm is not None:
        parts = lm.parts
        if any(a is not m for a, m in zip(parts.mlp_adds, parts.mlps, strict=True)):
            raise BadInput(f"{param('export')} {export}: {parts.family.name} puts a norm after "
                           f"the MLP, "
                           "so the transcoders rebuild what the stream receives after it, while "
                           "circuit-tracer's mlp.hook_out is the MLP's own output before it; "
                           f"train without {param('export')}")


def disk_bytes(d: int, positions: int, n_layers: int) -> int:
    """The collection's files: every block's MLP input and output rows, float32."""
    return 2 * n_layers * training_bytes(d, TrainOptions(layer=0), positions)["stream"]


def check_resources(d: int, opts: TrainOptions, positions: int, n_layers: int, out: str) -> None:
    """Refuse a run that would not fit: RAM as train.check_memory (one transcoder and one
    block's rows: OutOfMemory, exit 3); the collection's files (n_layers blocks; 0 when none is
    to be collected) against 90% of the free disk where --out is (WriteFailed, exit 74)."""
    from fptrace.models.memory import human_bytes

    check_memory(d, opts, positions, transcoder=True)
    need = disk_bytes(d, positions, n_layers)
    where = os.path.abspath(out)
    while not os.path.exists(where):
        where = os.path.dirname(where)
    free = shutil.disk_usage(where).free
    if need > 0.9 * free:
        raise WriteFailed(
            f"features train {param('transcoder')} needs about {human_bytes(need)} of disk under "
            f"{param('out')} "
            f"{out} for the MLPs' inputs and outputs ({n_layers} blocks × 2 × about {positions} "
            f"positions × d_model {d} × 4 bytes) but {human_bytes(free)} is free there: train "
            "fewer blocks at a time, on fewer prompts, or write to a larger disk")


def check_before_load(opts: TrainOptions, inputs: Sequence[str], model: str,
                      layers: Any, export: str | None, out: str, resume: bool) -> list:
    """train.check_before_load's checks for a transcoder run, with the blocks (`layers`: a
    Selection, None for all) and --export checked against the model's config and the disk
    where it can be read before the load (train_transcoders checks again once loaded). The
    prompts, read once, are returned."""
    from fptrace.addresses import resolve_selection
    from fptrace.core.inputs import read_inputs

    check_options(opts)
    if export is not None and export not in EXPORTS:
        check_export(export, [], 0)
    check_out(out, resume, MANIFEST, "transcoder training")
    items = read_inputs(list(inputs))
    sizes = model_sizes(model)
    if sizes is not None and sizes[1] > 0:
        d, n, name = sizes
        chosen = resolve_selection(layers, n, "layers", name, "block")
        blocks = list(chosen) if chosen is not None else list(range(n))
        check_export(export, blocks, n)
        check_resources(d, opts, estimated_positions(items), 0 if resume else len(blocks), out)
    return items


def _run_options(opts: TrainOptions) -> dict:
    return {k: v for k, v in opts.__dict__.items() if k != "layer"}


def _write_manifest(out: str, doc: dict) -> None:
    os.makedirs(out, exist_ok=True)
    atomic_write(os.path.join(out, MANIFEST), json.dumps(doc, indent=1).encode())


def _resumed_run(out: str, opts: TrainOptions, layers: Sequence[int], export: str | None,
                 source: dict) -> dict:
    """The run in `out`, refused where its options, blocks, export, weights or prompts are not
    this run's (the weights and prompts as train.py compares them)."""
    from fptrace.core.dictionaries import read_json

    doc = read_json(os.path.join(out, MANIFEST))
    if doc.get("options") != _run_options(opts) or doc.get("layers") != list(layers) or \
            doc.get("export") != export:
        raise BadInput(f"{param('resume')}: {out!r} was trained with other options (blocks "
                       f"{doc.get('layers')}, export {doc.get('export')}, {doc.get('options')});"
                       " resume with the same ones")
    check_source(out, doc, source)
    if not isinstance(doc.get("done"), dict):
        raise BadInput(f"{param('resume')}: {os.path.join(out, MANIFEST)!r} is not a transcoder "
                       f"run's "
                       "record (no `done`)")
    return doc


def collect_mlp(lm: LoadedModel, items: Sequence[Any], layers: Sequence[int], files: dict,
                progress: Callable | None = None, batch_size: int = 8) -> int:
    """Append, for every prompt of `items`, the selected blocks' MLP inputs and outputs at
    every position but its first to files[(layer, "in" | "out")] (open binary files), as
    float32 rows of d_model; the number of rows each file received."""
    import torch

    from fptrace.core.prompt_groups import Summary, run_groups
    from fptrace.core.trace import padded_batch

    sites = [Site(i, p) for i in layers for p in (MLP_IN, Point.mlp_out)]
    rows = 0

    def work(group: list) -> list:
        ids = [list(e.ids) for e in group]
        input_ids, _, kwargs = padded_batch(lm, ids)
        cap = capture(lm, input_ids, set(), sites, **kwargs)
        T = input_ids.shape[1]
        out = []
        for r in range(len(group)):
            start = T - len(ids[r]) + 1  # left padding; the first position left out
            out.append({(s.layer, "in" if s.point is MLP_IN else "out"):
                        cap.at(s)[r, start:].cpu().contiguous() for s in sites})  # (t, d)
        return out

    def emit(chunk: list, results: list, failures: dict) -> None:
        nonlocal rows
        for res in results:
            for per_prompt in res:
                for key, x in per_prompt.items():
                    files[key].write(x.numpy().tobytes())
                rows += int(next(iter(per_prompt.values())).shape[0])

    summary = Summary(total=len(items))
    with torch.inference_mode():
        run_groups(lm, items, work, emit, summary=summary, batch_size=batch_size,
                   truncate=True, progress=progress)
    if summary.interrupted:  # run_groups stops between groups; the collection is not whole
        raise KeyboardInterrupt
    return rows


def _collect(lm: LoadedModel, out: str, layers: Sequence[int], kept: list, held: list,
             progress: Callable | None) -> dict:
    """The collection pass (see the module's text): {"train": rows, "held": rows, "d": d}."""
    from contextlib import ExitStack

    from fptrace.core.inputs import prompt_to_json

    # run in order of length (a group is padded to its longest prompt: random groups of the
    # docstring corpus's paragraphs spend about a third of the pass on padding)
    def by_length(part: list) -> list:
        return sorted(part, key=lambda it: len(prompt_to_json(it.prompt))
                      if it.prompt is not None else 0)

    kept, held = by_length(kept), by_length(held)
    os.makedirs(os.path.join(out, ACTIVATIONS), exist_ok=True)
    try:
        with ExitStack() as stack:
            handles = {(i, side): stack.enter_context(open(path, "wb"))
                       for i in layers for side, path in _files(out, i).items()}
            n = len(kept) + len(held)
            tick = None if progress is None else (lambda p, t: progress("prompts", p, n))
            n_train = collect_mlp(lm, kept, layers, handles, tick)
            n_held = collect_mlp(lm, held, layers, handles, tick)
            for f in handles.values():
                f.flush()
                os.fsync(f.fileno())
    except OSError as e:
        raise WriteFailed(f"cannot write the collected activations under {out!r}: "
                          f"{e.strerror or e}") from None
    if n_train == 0 or n_held == 0:
        raise BadInput("the prompts give no positions to train on (each prompt's first position "
                       "is left out: give prompts of two tokens or more)")
    return {"train": n_train, "held": n_held, "d": int(lm.config.hidden_size)}


def _collection_whole(out: str, layers: Sequence[int], collected: dict | None) -> bool:
    if not collected:
        return False
    size = (collected["train"] + collected["held"]) * collected["d"] * 4
    return all(os.path.isfile(p) and os.path.getsize(p) == size
               for i in layers for p in _files(out, i).values())


def _rows(path: str, start: int, count: int, d: int) -> Any:
    """count float32 rows of d from row `start` of a collected file, as a (count, d) tensor."""
    import numpy as np
    import torch

    a = np.fromfile(path, dtype=np.float32, count=count * d, offset=start * d * 4)
    return torch.from_numpy(a.reshape(count, d))


def _scale(x: Any) -> float:
    """√d / the mean norm of x's rows (1 for rows of zeros)."""
    mean = float(x.double().norm(dim=-1).mean())
    return x.shape[1] ** 0.5 / mean if mean > 0 else 1.0


def _fold(sae: TopK, s_in: float, s_out: float) -> None:
    """Weights trained on x·s_in → y·s_out made the same map of x → y: W_enc·s_in, W_dec and
    b_dec / s_out (the encoder's bias and the activations are unchanged)."""
    import torch

    with torch.no_grad():
        sae.W_enc.mul_(s_in)
        sae.W_dec.div_(s_out)
        sae.b_dec.div_(s_out)
        if sae.W_skip is not None:  # y·s_out = x·s_in·W'  ⇒  W = W'·s_in / s_out
            sae.W_skip.mul_(s_in / s_out)


def jumprelu_threshold(sae: TopK, x: Any, k: int, rows: int = THRESHOLD_ROWS) -> float:
    """The one threshold θ at which relu(x·W_enc + b_enc) > θ fires k latents a position on
    average over up to `rows` positions of x, evenly spaced: the (M·k)-th largest
    pre-activation of M positions (0 where fewer are positive: then JumpReLU is ReLU)."""
    import torch

    with torch.no_grad():
        step = max(1, x.shape[0] // rows)
        sample = x[::step][:rows]  # (M, d)
        pre = sae.pre(sample).flatten()  # (M·n,)
        want = min(sample.shape[0] * k, pre.numel())
        return float(pre.topk(want).values[-1].clamp(min=0))


def evaluate_jumprelu(sae: TopK, theta: float, x: Any, y: Any) -> tuple[float, float]:
    """(FVU, L0) of the JumpReLU transcoder with sae's weights and threshold θ."""
    import torch

    with torch.no_grad():
        pre = sae.pre(x)  # (N, n), after the ReLU
        a = torch.where(pre > theta, pre, torch.zeros_like(pre))
        err = y - sae.out(a, x)
        fvu = float((err ** 2).sum() / ((y - y.mean(0)) ** 2).sum())
        return fvu, float((a != 0).sum(-1).float().mean())


def _export_layer(folder: str, layer: int, sae: TopK, theta: float) -> None:
    """circuit-tracer's per-layer file (its SingleLayerTranscoder.to_safetensors keys and
    orientation: W_enc and W_dec both (d_sae, d_model); its encoder is F.linear(x, W_enc))."""
    import torch
    from safetensors.torch import save

    n = sae.b_enc.shape[0]
    tensors = {"W_enc": sae.W_enc.detach().T.contiguous(),
               "W_dec": sae.W_dec.detach().contiguous(),
               "b_enc": sae.b_enc.detach().clone(), "b_dec": sae.b_dec.detach().clone(),
               "activation_function.threshold": torch.full((n,), theta)}
    if sae.W_skip is not None:  # its compute_skip: x @ W_skip.T, W_skip (d_model, d_model)
        tensors["W_skip"] = sae.W_skip.detach().T.contiguous()
    os.makedirs(folder, exist_ok=True)
    atomic_write(os.path.join(folder, f"layer_{layer}.safetensors"), save(tensors))


def _export_config(folder: str, layers: Sequence[int], lm: LoadedModel) -> None:
    """circuit-tracer's config.yaml: what its load_transcoders reads (model_kind, the hooks,
    scan, transcoders: the files in layer order) and what its command line takes the model's
    name from (model_name). Written as JSON-quoted strings, which YAML reads as they are."""
    model_name = lm.name
    try:
        from fptrace.models.registry import resolve

        known = resolve(lm.name).known
        if known is not None:
            model_name = known.hub_id
    except FptraceError:
        pass
    lines = ["# circuit-tracer's transcoder set, written by fptrace features train --transcoder "
             "--export circuit-tracer",
             f"# trained on the weights fptrace loaded as {lm.name!s}",
             "model_kind: transcoder_set",
             f"model_name: {json.dumps(model_name)}",
             'feature_input_hook: "mlp.hook_in"',
             'feature_output_hook: "mlp.hook_out"',
             f"scan: {json.dumps('fptrace/' + os.path.basename(os.path.normpath(lm.name)))}",
             "transcoders:"]
    lines += [f"  - {json.dumps(os.path.abspath(os.path.join(folder, f'layer_{i}.safetensors')))}"
              for i in layers]
    atomic_write(os.path.join(folder, "config.yaml"), ("\n".join(lines) + "\n").encode())


def train_transcoders(lm: LoadedModel, inputs: Sequence[str], out: str, opts: TrainOptions,
                      layers: Selection | Sequence[int] | None = None, *,
                      export: str | None = None,
                      resume: bool = False, progress: Callable[[str, int, int], None] | None = None,
                      items: Sequence[Any] | None = None) -> TranscodersResult:
    """Train and write one transcoder per block of `layers` (a Selection, or block numbers,
    negative ones from the end; None: every block); see the module's text. opts.layer is not
    read. progress(phase, done, total): phase `prompts` while collecting (done: the prompts of
    the group just run), `layer L` while block L trains (done: its steps so far)."""
    from fptrace.addresses import resolve_selection
    from fptrace.core.inputs import read_inputs
    from fptrace.models.fingerprint import weights_fingerprint

    info = model_info(lm)
    chosen = resolve_selection(layers, info.n_layers, "layers", lm.name, "block") \
        if layers is not None else None
    blocks = list(chosen) if chosen is not None else list(range(info.n_layers))
    check_options(opts)
    check_export(export, blocks, info.n_layers, lm)
    check_out(out, resume, MANIFEST, "transcoder training")
    items = list(items) if items is not None else read_inputs(list(inputs))
    if len(items) < 2:
        raise BadInput("give two prompts or more: a tenth of them (at least one) is held out")
    source = {"model": lm.name, "weights": weights_fingerprint(lm),
              "inputs": inputs_digest(items), "prompts": len(items)}
    if resume:
        doc = _resumed_run(out, opts, blocks, export, source)
    else:
        doc = {"kind": "fptrace features train --transcoder", "options": _run_options(opts),
               "layers": blocks, "export": export, **source, "collected": None, "done": {}}
    todo = [i for i in blocks if str(i) not in doc["done"]]
    fresh = bool(todo) and not _collection_whole(out, todo, doc.get("collected"))
    check_resources(info.d_model, opts, estimated_positions(items), len(todo) if fresh else 0,
                    out)
    kept, held = split_held_out(items, opts)
    t_collect = time.perf_counter()
    if fresh:
        doc["collected"] = None
        _write_manifest(out, doc)
        doc["collected"] = _collect(lm, out, todo, kept, held, progress)
    _write_manifest(out, doc)
    collected = doc["collected"]
    collect_seconds = time.perf_counter() - t_collect if fresh else 0.0
    t0 = time.perf_counter()
    export_dir = os.path.join(out, EXPORT_FOLDER[export]) if export else None
    for i in todo:
        doc["done"][str(i)] = _train_layer(lm, out, i, opts, source, collected, export_dir,
                                           progress)
        _write_manifest(out, doc)
        for name in (STATE, STATE_JSON):  # the block is done: its checkpoint is not needed
            path = os.path.join(layer_folder(out, i), name)
            if os.path.exists(path):
                os.remove(path)
    if export_dir is not None:
        _export_config(export_dir, blocks, lm)
    shutil.rmtree(os.path.join(out, ACTIVATIONS), ignore_errors=True)
    rows = tuple(TranscoderLayer(**{**doc["done"][str(i)], "kept": i not in todo})
                 for i in blocks)
    c = doc["collected"] or {"train": 0, "held": 0}
    return TranscodersResult(
        out=out, model=info, layers=rows, latents=opts.latents, k=opts.k,
        prompts=len(kept), held_out_prompts=len(held), train_tokens=int(c["train"]),
        held_out_tokens=int(c["held"]),
        tokens_seen=max(1, opts.tokens // opts.batch_tokens) * opts.batch_tokens,
        fvu_median=float(statistics.median(r.fvu for r in rows)), collected=fresh,
        collect_seconds=collect_seconds, seconds=time.perf_counter() - t0, export=export,
        export_folder=export_dir, skip=opts.skip)


def _train_layer(lm: LoadedModel, out: str, layer: int, opts: TrainOptions, source: dict,
                 collected: dict, export_dir: str | None, progress: Callable | None) -> dict:
    """Train block `layer`'s transcoder from the collected rows (continuing its checkpoint
    where there is one), write it, and return its figures (TranscoderLayer's fields)."""
    folder = layer_folder(out, layer)
    lopts = replace(opts, layer=layer)
    doc = resumed_state(folder, lopts, source) if os.path.isfile(
        os.path.join(folder, STATE_JSON)) else None
    n_train, n_held, d = collected["train"], collected["held"], collected["d"]
    f = _files(out, layer)
    x, y = _rows(f["in"], 0, n_train, d), _rows(f["out"], 0, n_train, d)  # (N, d) each
    xh, yh = _rows(f["in"], n_train, n_held, d), _rows(f["out"], n_train, n_held, d)
    # trained on rows scaled to a mean norm of √d (so that one learning rate suits every block,
    # whatever its MLP's scale), the scales folded into the weights before they are written
    s_in, s_out = _scale(x), _scale(y)
    for t, s in ((x, s_in), (y, s_out), (xh, s_in), (yh, s_out)):
        t.mul_(s)
    t0 = time.perf_counter()
    sae = TopK(d, opts.latents, opts.k, opts.seed, shift_input=False, skip=opts.skip)
    tick = None if progress is None else (lambda done, total: progress(f"layer {layer}", done,
                                                                       total))
    steps, resumed_from, losses = fit(sae, x, y, folder, lopts, source, doc, tick)
    fvu, l0, dead = evaluate(sae, xh, yh)  # the FVU does not change with the output's scale
    _fold(sae, s_in, s_out)
    for t, s in ((x, s_in), (xh, s_in), (yh, s_out)):
        t.div_(s)
    write_saelens_folder(folder, sae, lopts, lm, transcoder=True)
    theta = efvu = el0 = None
    if export_dir is not None:
        theta = jumprelu_threshold(sae, x, opts.k)
        efvu, el0 = evaluate_jumprelu(sae, theta, xh, yh)
        _export_layer(export_dir, layer, sae, theta)
    return {"layer": layer, "folder": folder, "site": hook_name(Site(layer, MLP_IN)),
            "out_site": hook_name(Site(layer, Point.mlp_out)), "fvu": fvu, "l0": l0,
            "dead_latents": dead, "steps": steps, "resumed_from": resumed_from,
            "first_loss": float(losses[0]) if losses else float("nan"),
            "last_loss": float(sum(losses[-10:]) / len(losses[-10:])) if losses
            else float("nan"),
            "seconds": time.perf_counter() - t0, "export_threshold": theta,
            "export_fvu": efvu, "export_l0": el0}


__all__ = ["EXPORTS", "MANIFEST", "TRANSCODER_LR", "check_before_load", "check_export",
           "check_resources", "collect_mlp", "disk_bytes", "evaluate_jumprelu",
           "jumprelu_threshold", "layer_folder", "train_transcoders"]
