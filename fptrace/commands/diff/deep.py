"""`fptrace diff --deep`: where, inside the blocks, two runs of one prompt part.

Each run records, in every block compared, the points of the vocabulary (points.py) where
its own modules show them: the block's input and output, the norms' outputs, W_O's input (z) and
output, the attention weights (the attention module's own, under eager attention), the
post-norms, the MLP's gate, up, activation (W_down's input) and output. q, k and v after their
norms and RoPE show in no module: each side recomputes them from its own hooked projections
with its own config (the family's `heads`, the function explain's walkthrough runs). So a
different weight, config or implementation shows at the point where it acts.

The two forward passes run side by side, one thread each, in lockstep: at the end of each block
compared, each side hands over that block's points and waits while they are compared, so only
one block's worth of points is held at a time (the memory of a plain diff plus one block). Each
side's pass is `run_trace`'s, so the block-level table is the plain diff's, from the same passes.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from fptrace.addresses import Selection, Site, resolve_selection
from fptrace.commands.diff.core import diff
from fptrace.commands.diff.notes import DEEP_BLOCK_LEVEL, DEEP_MISSING
from fptrace.commands.diff.result import (
    BlockDiff,
    DeepDiff,
    ErrorShare,
    LensDiff,
    Parting,
    PointDiff,
    TraceDiff,
)
from fptrace.core.hooks import Hook, hooked
from fptrace.core.taps import hooks_at, tap_hook
from fptrace.errors import BadInput, UnsupportedModel, param
from fptrace.families import Family, Tap
from fptrace.families.kinds import PositionKind
from fptrace.families.ops import Steps
from fptrace.families.parts import dims
from fptrace.models.loading import LoadedModel
from fptrace.points import BLOCK, Point, inputs

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch import nn

    from fptrace.models.prompts import Prompt
    from fptrace.results import Trace

HEADED = (Point.q, Point.k, Point.v, Point.attn_weights, Point.z)  # error shown by head
RECOMPUTED = (Point.q, Point.k, Point.v)
TOP = 5  # heads and channels listed
# the operation itself differs when its inputs agree and the difference grows more than this
# across it; less, and it carries on what its inputs already had
GROWTH = 10.0


def _no_points(fam: Family) -> str:
    return f"the {fam.name} family has no points recorded inside its blocks"


def mismatch(a: LoadedModel, b: LoadedModel) -> str | None:
    """Why the points of a and b cannot be compared one for one, or None when they can."""
    fa, fb = a.parts.family, b.parts.family
    if fa.name != fb.name:
        return f"a is a {fa.title} model ({fa.name}) and b a {fb.title} one ({fb.name})"
    if fa.heads is None:
        return _no_points(fa)
    da, db = dims(a.config, fa), dims(b.config, fb)
    shape = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_mlp")
    diffs = [f"{k} {getattr(da, k)} and {getattr(db, k)}" for k in shape
             if getattr(da, k) != getattr(db, k)]
    if diffs:
        return "the two models' blocks differ in shape (" + ", ".join(diffs) + ")"
    if a.parts.parallel_residual != b.parts.parallel_residual:
        return "one model has a parallel residual and the other not"
    return None


# ---------------------------------------------------------------- one side's recording

class _Stop(Exception):
    """Raised inside a side's forward pass when the comparison ends before it."""


class _Side:
    """One run: its forward pass in a thread, handing over each compared block's points."""

    def __init__(self, lm: LoadedModel, prompt: Prompt, layers: Sequence[int]) -> None:
        self.lm, self.prompt, self.layers = lm, prompt, layers
        fam = lm.parts.family
        self.taps = fam.block_taps(lm.parts.parallel_residual) if layers else {}
        self.out: queue.Queue = queue.Queue()  # ("block", layer, points) / ("done", trace) / error
        self.go: queue.Queue = queue.Queue()  # "next" or "stop"
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"fptrace-diff-{lm.name}")

    def _run(self) -> None:
        from fptrace.core.trace import run_trace

        try:
            with hooked(self._hooks()):
                trace = run_trace(self.lm, self.prompt, snippet=int(self.lm.config.hidden_size))
            self.out.put(("done", trace, lens(self.lm, trace)))
        except BaseException as e:  # handed to the main thread, which raises it
            self.out.put(("error", e))

    def _hooks(self) -> list[Hook]:
        hooks: list[Hook] = []
        fam = self.lm.parts.family
        for layer in self.layers:
            blk = self.lm.parts.blocks[layer]
            got: dict = {}
            hooks += hooks_at(self.lm, [Site(layer, p) for p in self.taps],
                              partial(_keep_site, got))
            for i, path in enumerate(fam.head_taps):
                hooks.append(tap_hook(blk.get_submodule(path), Tap(path),
                                      partial(_keep, got, ("proj", i))))
            hooks.append(Hook.after(blk, self._handover(layer, blk, got)))
        return hooks

    def _handover(self, layer: int, blk: nn.Module, got: dict):
        """After the block: q, k, v from the projections, then wait while they are compared."""
        lm = self.lm
        fam = lm.parts.family
        heads = fam.heads
        if heads is None:  # mismatch() refuses such a family before the pass
            raise UnsupportedModel(_no_points(fam))
        dm = dims(lm.config, fam)
        quiet = Steps(head=0, kv_head=0, n_heads=dm.n_heads, n_kv_heads=dm.n_kv_heads,
                      quiet=True)

        def hook(module: nn.Module, args: tuple, output: object) -> None:
            projections = [got.pop(("proj", i)) for i in range(len(fam.head_taps))]
            q, k, v = heads(*projections, blk.get_submodule(fam.attn), lm.config, layer,
                            quiet, lm.model, fam)
            got.update({Point.q: q, Point.k: k, Point.v: v})
            points = dict(got)
            got.clear()
            self.out.put(("block", layer, points))
            if self.go.get() == "stop":
                raise _Stop()

        return hook


def _keep_site(got: dict, site: Site, x: torch.Tensor | None) -> None:
    _keep(got, site.point, x)


def _keep(got: dict, key: object, x: torch.Tensor | None) -> None:
    """What a tap's hook does with its tensor: a float32 copy in got[key]; nothing where the
    module returned none (the attention weights unless the attention is eager)."""
    import torch

    if x is not None:
        got[key] = x.detach().to(torch.float32, copy=True)


# ---------------------------------------------------------------- the comparison

def _shares(e2: torch.Tensor, n: int) -> tuple[ErrorShare, ...]:
    """The n largest entries of a vector of squared errors, with their share of the total."""
    total = float(e2.sum())
    top = e2.topk(min(n, e2.numel()))
    return tuple(ErrorShare(index=int(i), share=float(v) / total if total > 0 else 0.0)
                 for v, i in zip(top.values.tolist(), top.indices.tolist()) if v > 0)


def _where_nonfinite(bad: torch.Tensor, n: int) -> tuple[ErrorShare, ...]:
    """The n heads or channels holding the most NaN/Inf values (counts in bad), share null."""
    top = bad.topk(min(n, bad.numel()))
    return tuple(ErrorShare(index=int(i), share=None)
                 for v, i in zip(top.values.tolist(), top.indices.tolist()) if v > 0)


def compare_point(point: Point, a: torch.Tensor, b: torch.Tensor, n_heads: int) -> dict:
    """rel, max_abs, nonfinite and the heads or channels carrying the error of one point
    (a, b: float32 tensors of one shape)."""
    import torch

    b = b.to(a.device)
    if point == Point.z:  # (B, T, nh*hd) -> (B, T, nh, hd): the heads side by side
        a, b = (t.reshape(*t.shape[:-1], n_heads, -1) for t in (a, b))
    axis = -2 if point == Point.z else 1 if point in HEADED else -1

    def per_axis(x: torch.Tensor) -> torch.Tensor:  # summed over all but the head/channel axis
        return x.movedim(axis, -1).reshape(-1, x.shape[axis]).sum(dim=0)

    d = b - a
    if not bool(torch.isfinite(d).all()):  # NaN or Inf in a or b (or a difference past float32)
        bad = ~(torch.isfinite(a) & torch.isfinite(b) & torch.isfinite(d))
        where = _where_nonfinite(per_axis(bad.float()), TOP)
        return dict(rel=math.inf, max_abs=math.inf, nonfinite=True,
                    heads=where if point in HEADED else (),
                    channels=() if point in HEADED else where)
    na = float(torch.linalg.vector_norm(a))
    nd = float(torch.linalg.vector_norm(d))
    rel = nd / na if na > 0 else (0.0 if nd == 0 else math.inf)
    shares = _shares(per_axis(d * d), TOP) if nd > 0 else ()
    return dict(rel=rel, max_abs=float(d.abs().amax()) if nd > 0 else 0.0, nonfinite=False,
                heads=shares if point in HEADED else (),
                channels=() if point in HEADED else shares)


def compare_block(layer: int, pa: dict, pb: dict, order: Sequence[Point], parallel: bool,
                  n_heads: int, upstream_rel: float | None) -> BlockDiff:
    """The points both sides recorded for one block, in the order the data flows.
    upstream_rel: the relative difference of the block's input as seen before it (the previous
    block's output, or 0 for block 0's input, the token ids), None when not compared."""
    present = [p for p in order if p in pa and p in pb]
    rels: dict[Point, float] = {}  # inf where NaN/Inf (compare_point)
    rows = []
    for p in present:
        c = compare_point(p, pa[p], pb[p], n_heads)
        ins = inputs(p, present, parallel)
        if p == Point.resid_pre:
            ins_rel = upstream_rel
        else:
            known = [rels[i] for i in ins]
            ins_rel = max(known) if known else 0.0
        rels[p] = c["rel"]
        rows.append(PointDiff(point=p.value, recorded=p not in RECOMPUTED,
                              shape=tuple(int(s) for s in pa[p].shape), rel=c["rel"],
                              max_abs=c["max_abs"], nonfinite=c["nonfinite"],
                              inputs=tuple(i.value for i in ins), inputs_rel=ins_rel,
                              heads=c["heads"], channels=c["channels"]))
    worst = max(rows, key=lambda r: (r.nonfinite, r.rel if r.rel is not None else -1.0),
                default=None)
    return BlockDiff(layer=layer, points=tuple(rows), worst=worst.point if worst else None,
                     worst_rel=worst.rel if worst else None)


def _over(p: PointDiff, tolerance: float) -> bool:
    return p.nonfinite or p.rel is None or not p.rel <= tolerance


def parting(blocks: Sequence[BlockDiff], tolerance: float, rope: bool) -> Parting | None:
    """The first point over the tolerance, and whether its inputs already differed (rope:
    whether the family rotates q and k, for the sentence's words)."""
    for blk in blocks:
        for p in blk.points:
            if not _over(p, tolerance):
                continue
            block_in = next((q.rel for q in blk.points if q.point == Point.resid_pre.value),
                            None)
            rel = math.inf if p.rel is None else p.rel
            agree = p.inputs_rel is not None and p.inputs_rel <= tolerance and (
                p.nonfinite or rel > GROWTH * p.inputs_rel)
            return Parting(layer=blk.layer, point=p.point, rel=p.rel, nonfinite=p.nonfinite,
                           cause="operation" if agree else "upstream", inputs=p.inputs,
                           inputs_rel=p.inputs_rel, block_input_rel=block_in, heads=p.heads,
                           channels=p.channels, sentence=_sentence(blk.layer, p, agree,
                                                                   block_in, rope))
    return None


def _carriers(p: PointDiff) -> str:
    items = p.heads or p.channels
    if not items:
        return ""
    what = "heads" if p.heads else "channels"
    if items[0].share is None:
        return f"; NaN/Inf in {what} " + ", ".join(str(s.index) for s in items)
    shown = [s for s in items if s.share is not None and s.share >= 0.01]
    return f"; {what} " + ", ".join(f"{s.index} ({s.share:.0%})" for s in shown) + \
        " carry it"


def _to(rel: float) -> str:
    return "exactly" if rel == 0 else f"to {rel:.1g}"


def _sentence(layer: int, p: PointDiff, agree: bool, block_in: float | None,
              rope: bool) -> str:
    title = Point(p.point).title_in(rope)
    head = f"block {layer}, {title}: " + ("NaN/Inf" if p.nonfinite else f"rel {p.rel:.2g}")
    if p.point == Point.resid_pre.value:
        if p.inputs_rel is None:
            return (f"{head}: inputs differ before block {layer}, the first block compared; the "
                    "cause is upstream (compare from block 0)")
        return f"{head}, from the same token ids: the operation differs (the embedding)"
    names = ", ".join(p.inputs)
    if agree and p.inputs_rel is not None:
        block = f" and block {layer}'s input {_to(block_in)}" if block_in is not None and \
            Point.resid_pre.value not in p.inputs else ""
        return (f"{head}, while its inputs ({names}) agree {_to(p.inputs_rel)}{block}: the "
                f"operation differs{_carriers(p)}")
    return (f"{head}; its inputs ({names}) already differ by {p.inputs_rel:.2g}: inputs differ, "
            f"the cause is upstream{_carriers(p)}")


def lens(lm: LoadedModel, trace: Trace) -> tuple[torch.Tensor, torch.Tensor]:
    """One run's stream rows at the last position (L+1, d) and their logit lens, log-softmax
    (L+1, V): its own final norm and LM head (and final softcap) on its own stream. The
    log-softmax is taken in float64, so that the KL of two lenses that barely differ is their
    difference, not float32's rounding (which made it 0 on one CPU and 5e-8 on another)."""
    import torch

    x = torch.tensor([list(r.snippet) for r in trace.layers], dtype=torch.float32)  # (L+1, d)
    with torch.inference_mode():
        logits = lm.parts.project(x.to(lm.device, lm.dtype))  # (L+1, V)
    return x, torch.log_softmax(logits.cpu().double(), dim=-1)


def lens_rows(trace: Trace, lens_a: tuple[torch.Tensor, torch.Tensor],
              lens_b: tuple[torch.Tensor, torch.Tensor]) -> tuple[LensDiff, ...]:
    """Per stream row (embedding, blocks), at the last position: KL(a ‖ b) of the two logit
    lenses and the channels of the stream's error."""
    import torch

    (xa, la), (xb, lb) = lens_a, lens_b
    if xa.shape != xb.shape or la.shape != lb.shape:  # models of other widths or vocabularies
        return ()
    kl = (la.exp() * (la - lb)).sum(dim=-1).clamp(min=0.0)  # (L+1,): ≥ 0 but for rounding
    rows = []
    for i, r in enumerate(trace.layers):
        d = (xb[i].double() - xa[i].double())
        finite = bool(torch.isfinite(d).all())
        rows.append(LensDiff(
            layer=r.layer, kl=float(kl[i]) if bool(torch.isfinite(kl[i])) else math.nan,
            channels=_shares(d * d, TOP) if finite else
            _where_nonfinite((~torch.isfinite(d)).double(), TOP)))
    return tuple(rows)


# ---------------------------------------------------------------- both sides, in lockstep

def _next(side: _Side) -> tuple:
    """The next message of a side; an error in it is raised here (the sides are stopped by
    the caller)."""
    while True:
        try:
            msg = side.out.get(timeout=0.5)
        except queue.Empty:
            continue
        if msg[0] == "error":
            raise msg[1]
        return msg


def run_sides(lm_a: LoadedModel, lm_b: LoadedModel, prompt: Prompt, layers: Sequence[int],
              compare: Callable[[int, dict, dict], object]) -> tuple[tuple, tuple, list]:
    """Both forward passes in lockstep: compare(layer, points_a, points_b) at the end of each
    block of `layers`, then each side's (trace, lens). Eager attention (for its weights) while
    they run."""
    sides = [_Side(lm_a, prompt, layers), _Side(lm_b, prompt, layers)]
    before = [_attention(s.lm, "eager") if layers else None for s in sides]
    results = []
    try:
        for s in sides:
            s.thread.start()
        for layer in layers:
            msgs = [_next(s) for s in sides]
            if any(m[0] != "block" or m[1] != layer for m in msgs):
                raise RuntimeError(f"the two runs did not reach block {layer} together")
            results.append(compare(layer, msgs[0][2], msgs[1][2]))
            del msgs
            for s in sides:
                s.go.put("next")
        traces = [_next(s) for s in sides]
        if any(m[0] != "done" for m in traces):
            raise RuntimeError("a run went past the blocks compared")
        return traces[0][1:], traces[1][1:], results
    finally:
        for s in sides:
            if s.thread.is_alive():
                for _ in range(len(layers) + 1):
                    s.go.put("stop")
                s.thread.join(timeout=60)
        for s, impl in zip(sides, before):
            if impl is not None:
                _attention(s.lm, impl)


def record(lm: LoadedModel, prompt: Prompt, layers: Sequence[int], attention: str = "eager"
           ) -> tuple[Trace, tuple[torch.Tensor, torch.Tensor], dict]:
    """One model's pass with the points of `layers` recorded, for a comparison against another
    engine's numbers: (trace, lens, {layer: points}). The attention implementation `attention`
    while it runs (eager: its weights are recorded; another engine's, emulated: that one)."""
    side = _Side(lm, prompt, layers)
    before = _attention(lm, attention) if layers else None
    points: dict = {}
    try:
        side.thread.start()
        for layer in layers:
            msg = _next(side)
            if msg[0] != "block" or msg[1] != layer:
                raise RuntimeError(f"the run did not reach block {layer}")
            points[layer] = msg[2]
            side.go.put("next")
        done = _next(side)
        return done[1], done[2], points
    finally:
        if side.thread.is_alive():
            for _ in range(len(layers) + 1):
                side.go.put("stop")
            side.thread.join(timeout=60)
        if before is not None:
            _attention(lm, before)


def _attention(lm: LoadedModel, impl: str) -> str | None:
    """Set the model's attention implementation; returns the one it had."""
    before = getattr(lm.config, "_attn_implementation", None)
    if before != impl and hasattr(lm.model, "set_attn_implementation"):
        try:
            lm.model.set_attn_implementation(impl)
        except (ValueError, ImportError):  # not settable: its weights may then be missing
            return None
    return before


def deep_diff(lm_a: LoadedModel, lm_b: LoadedModel, prompt: Prompt, *,
              layers: Sequence[int] | Selection | None = None,
              labels: tuple[str, str] = ("a", "b"), tolerance: float | None = None
              ) -> TraceDiff:
    """Run `prompt` on both models side by side and compare them block by block (the plain
    diff) and, inside the blocks of `layers` (a list of blocks, negative ones counted from the
    end; None: every block), point by point."""
    if lm_a.model is lm_b.model:
        raise BadInput(f"diff {param('deep')} runs the two models side by side: load the model "
                       f"twice "
                       "(a model compared with itself is two loads of it)")
    ids_a, ids_b = lm_a.encode(prompt), lm_b.encode(prompt)
    if ids_a != ids_b:
        raise BadInput("the two runs tokenize the prompt differently: "
                       f"{labels[0]} {[lm_a.token_text(i) for i in ids_a]} vs "
                       f"{labels[1]} {[lm_b.token_text(i) for i in ids_b]}; their streams "
                       "cannot be compared position for position")
    why_not = mismatch(lm_a, lm_b)
    n = len(lm_a.parts.blocks)
    chosen = (resolve_selection(layers, n, "layers", lm_a.name, "block") or tuple(range(n))) \
        if why_not is None else ()
    fam = lm_a.parts.family
    recorded = fam.block_taps(lm_a.parts.parallel_residual) if why_not is None else {}
    order = tuple(p for p in BLOCK if p in recorded or (recorded and p in RECOMPUTED))
    nh = dims(lm_a.config, fam).n_heads
    parallel = lm_a.parts.parallel_residual
    last: dict = {}  # the previous compared block's output rel, for the next block's input

    def compare(layer: int, pa: dict, pb: dict) -> BlockDiff:
        import torch

        upstream = 0.0 if layer == 0 else last.get(layer - 1)
        with torch.inference_mode():
            blk = compare_block(layer, pa, pb, order, parallel, nh, upstream)
        last[layer] = next((p.rel for p in blk.points if p.point == Point.resid_post.value),
                           None)
        return blk

    # one tokenizer object shared by both (two wraps of one): the runs get the ids, so that it
    # is not used from two threads at once
    given = ids_a if lm_a.tokenizer is not None and lm_a.tokenizer is lm_b.tokenizer else prompt
    (ta, lens_a), (tb, lens_b), blocks = run_sides(lm_a, lm_b, given, chosen, compare)
    base = diff(ta, tb, labels=labels, tolerance=tolerance, same_input=True)
    notes = [DEEP_BLOCK_LEVEL(reason=why_not)] if why_not else []
    missing = sorted({p for b in blocks for p in order if p.value not in
                      {q.point for q in b.points}}, key=order.index)
    if missing:
        notes.append(DEEP_MISSING(points=", ".join(p.value for p in missing)))
    parted = parting(blocks, base.tolerance, fam.positions is PositionKind.rope)
    deep = DeepDiff(
        family_a=fam.name, family_b=lm_b.parts.family.name, compared=why_not is None,
        layers=chosen, points=tuple(p.value for p in order),
        recomputed=tuple(p.value for p in RECOMPUTED) if why_not is None else (),
        tolerance=base.tolerance, blocks=tuple(blocks), lens=lens_rows(ta, lens_a, lens_b),
        parted=parted, notes=tuple(notes))
    return dataclasses.replace(base, deep=deep, within=base.within and parted is None)


__all__ = [
    "RECOMPUTED",
    "compare_block",
    "compare_point",
    "deep_diff",
    "lens",
    "lens_rows",
    "mismatch",
    "parting",
    "record",
    "run_sides",
]
