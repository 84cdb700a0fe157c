"""`fptrace ablate`: remove attention heads or MLPs and measure the target's logit.

The total effect of a part is what the target's logit does when the part is removed (its
output set to zero, or to its mean over positions: core/interventions.py), later blocks free to
react. Its direct effect is what its write into the stream contributes straight through the
final norm and the LM head: the part's direct logit attribution (core/attribution.py, what
`fptrace attribute` shows), with the sign of a removal. The difference is what later blocks did
with it (compensation, amplification). `--all-heads` and `--all-mlps` remove one part per run,
every run a row of a batched forward pass.

Every run is checked against the model: at the first block a run changes, what the stream
received from attention must be the clean attention output with the removed heads' writes
through W_O swapped for their replacement (the model's own modules, post-norms included,
applied to it), and what the block added must be its attention and MLP outputs; the command
fails (exit 5) when either does not hold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fptrace.addresses import Block, Expert, Head
from fptrace.commands.ablate.notes import (
    ABLATE_EXPERT_KEPT,
    ABLATE_EXPERT_NEXT,
    ABLATE_EXPERT_NONE_LEFT,
    ABLATE_EXPERT_RENORM,
    ABLATE_EXPERT_UNCHOSEN,
    ABLATE_MEAN,
    ABLATE_SOFTCAP,
    ABLATE_WO_BIAS,
)
from fptrace.commands.ablate.result import AblatedRun, Ablation
from fptrace.core import stats
from fptrace.core.attribution import MLP_PARTS, DirectLogits, direct_logits
from fptrace.core.dictionary_sites import hook_name
from fptrace.core.interventions import (
    MODES,
    Means,
    Part,
    ablation_hooks,
    check_rows_fit,
    mean_outputs,
    parts_of,
    run_rows,
)
from fptrace.core.routing import ROUTES
from fptrace.core.trace import base_notes, model_info, ranked_token
from fptrace.errors import BadInput, as_parameter, param
from fptrace.models.loading import LoadedModel
from fptrace.models.prompts import Prompt
from fptrace.results import Check, TopToken

if TYPE_CHECKING:
    import torch

LOWER = "lower --batch-size"


def ablate(lm: LoadedModel, prompt: Prompt, *, heads: Sequence[Head] = (),
           mlps: Sequence[int | Block] = (), all_heads: bool = False, all_mlps: bool = False,
           mode: str = "zero", mean_over: str | Sequence[str] | None = None,
           target: str | None = None, batch_size: int = 32, top: int = 10,
           sae: str | None = None, latent: int | None = None, experts: Sequence[Expert] = (),
           route: str = "renormalise", named: Callable[[str], str] = as_parameter
           ) -> Ablation:
    """The target's logit with parts removed: each of `heads` (`Head(layer, head)` values),
    `mlps` (block indices) and `experts` (`Expert(layer, expert)` values: a routed expert of a
    mixture of experts, gone from its router's choice as `route` says: `renormalise` or
    `next`) alone and all together, and with all_heads / all_mlps one part per run (negative
    blocks and heads count from the end); or, with sae and latent, what latent N of that SAE
    wrote, removed at every position. `named`: how an error about `target` names it (the
    CLI: --target)."""
    if sae is not None or latent is not None:
        if heads or mlps or experts or all_heads or all_mlps or mode != "zero" \
                or mean_over is not None:
            raise BadInput(f"{param('sae')}/{param('latent')} removes one latent: give it without "
                           f"{param('head')}, {param('mlp')}, "
                           f"{param('expert')}, {param('all_heads')}, {param('all_mlps')} and "
                           f"{param('mode')} mean")
        return _ablate_latent(lm, prompt, sae, latent, target, named)
    if mode not in MODES:
        raise BadInput(f"{param('mode')} {mode!r}: use zero or mean")
    if route not in ROUTES:
        raise BadInput(f"{param('route')} {route!r}: use renormalise or next")
    if route != "renormalise" and not experts:
        raise BadInput(f"{param('route')} goes with {param('expert')}: it says what a position "
                       f"does without an "
                       "expert it chose")
    if experts and mode != "zero":
        raise BadInput(f"{param('expert')} removes an expert from its router's choice "
                       f"({param('route')}); give it "
                       f"without {param('mode')} mean")
    if mean_over is not None and mode != "mean":
        raise BadInput(f"{param('mean_over')} goes with {param('mode')} mean")
    if batch_size < 1:
        raise BadInput(f"{param('batch_size')} must be at least 1")
    if top < 1:
        raise BadInput(f"{param('top')} must be at least 1")
    chosen = parts_of(lm, heads, mlps, experts)
    if not chosen and not (all_heads or all_mlps):
        raise BadInput(f"say what to remove: {param('head')} L.H, {param('mlp')} L, "
                       f"{param('expert')} L.E, {param('all_heads')} or "
                       f"{param('all_mlps')}")
    info = model_info(lm)
    L, nh = info.n_layers, info.n_heads
    runs: list[tuple[Part, ...]] = [(p,) for p in dict.fromkeys(chosen)]
    if len(runs) > 1:
        runs.append(tuple(sorted(dict.fromkeys(chosen), key=lambda p: p.order)))
    grid_heads = [(Part(l, h),) for l in range(L) for h in range(nh)] if all_heads else []
    grid_mlps = [(Part(l),) for l in range(L)] if all_mlps else []
    todo = list(dict.fromkeys(runs + grid_heads + grid_mlps))

    d = direct_logits(lm, prompt, target=target, named=named)
    ids, t = d.ids, d.target
    passes = 1
    routed = Routed(lm, d, route, sorted({p.layer for p in chosen if p.expert is not None}))
    means, prompts_n = None, None
    if mode == "mean":
        means, prompts_n = _means(lm, ids, mean_over)
        passes += prompts_n
    check_rows_fit(lm, min(batch_size, len(todo)), len(ids),
                   f"a batch of {min(batch_size, len(todo))} ablated runs of {len(ids)} tokens",
                   LOWER)
    done: dict[tuple[Part, ...], AblatedRun] = {}
    worst = {"attn": 0.0, "attn_bound": 0.0, "block": 0.0, "block_bound": 0.0, "expert": 0.0,
             "expert_bound": 0.0}
    failed: dict[str, float] = {}
    for start in range(0, len(todo), batch_size):
        chunk = todo[start:start + batch_size]
        out = run_rows(lm, ids, len(chunk), ablation_hooks(lm, chunk, means, route), LOWER)
        passes += 1
        for r, parts in enumerate(chunk):
            done[parts] = _run(lm, d, out, r, parts, means, routed)
            _check(lm, d, out, r, parts, means, worst, failed, routed)
    clean_logit = d.model_logit
    checks = _checks(worst, failed, bool(grid_heads or any(p.head is not None for p in chosen)),
                     bool(grid_mlps or any(p.is_mlp for p in chosen)), d.rtol,
                     any(p.expert is not None for p in chosen))
    grid = tuple(tuple(done[(Part(l, h),)].logit_change for h in range(nh)) for l in range(L)) \
        if all_heads else ()
    column = tuple(done[(Part(l),)].logit_change for l in range(L)) if all_mlps else ()
    largest = sorted((done[p] for p in grid_heads + grid_mlps),
                     key=lambda a: -abs(a.logit_change))[:top]
    return Ablation(
        prompt=d.prepared.text, model=info, tokens=lm.tokens(d.prepared), mode=mode,
        mean_over=mean_over if isinstance(mean_over, str) else None,
        mean_positions=None if means is None else means.positions,
        target=ranked_token(lm, d.logits, t), clean_logit=clean_logit,
        runs=tuple(done[p] for p in runs), head_grid=grid, mlp_column=column,
        largest=tuple(largest), checks=tuple(checks), ok=all(c.ok for c in checks),
        forward_passes=passes, notes=tuple(_notes(lm, d, mode, means, todo, routed)))


def _means(lm: LoadedModel, ids: list[int], mean_over: str | Sequence[str] | None
           ) -> tuple[Means, int]:
    """The means mean ablation puts in place, over the prompt or over --mean-over's prompts."""
    from fptrace.core.prompt_files import encode_listed, prompts_at

    if mean_over is None:
        prompts = [ids]
    else:
        listed = prompts_at(mean_over, "--mean-over") if isinstance(mean_over, str) \
            else [(f"mean_over[{k}]", p) for k, p in enumerate(mean_over)]
        prompts = encode_listed(lm, [p for _, p in listed], [w for w, _ in listed])
    return mean_outputs(lm, prompts), len(prompts)


class Routed:
    """The MoE blocks a run removes experts from, at the last position of the clean pass (as
    direct_logits's pass saw them), and what removing a set of a block's experts changes in its
    output there (cached)."""

    def __init__(self, lm: LoadedModel, d: DirectLogits, route: str, layers: list[int]) -> None:
        self.lm, self.route, self.layers = lm, route, layers
        self.routes = {layer: d.routes[layer] for layer in layers}
        self._changes: dict[tuple[int, tuple[int, ...]], Any] = {}

    def change(self, layer: int, experts: Sequence[int]) -> Any:
        """(C,) float32: the MoE output at the last position with `experts` gone minus the
        clean one, every other input unchanged."""
        from fptrace.core.routing import removal_change

        key = (layer, tuple(sorted(set(experts))))
        if key not in self._changes:
            self._changes[key] = removal_change(self.lm.parts, self.lm.config,
                                                self.routes[layer], key[1], self.route)
        return self._changes[key]

    def by_layer(self, parts: Sequence[Part]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for p in parts:
            if p.expert is not None:
                out.setdefault(p.layer, []).append(p.expert)
        return out

    def none_left(self, layer: int, experts: Sequence[int]) -> bool:
        """Whether removing `experts` leaves the last position no expert to take at that
        block: every one it chose (renormalise), every one of the block (next)."""
        if self.route == "next":
            return set(range(len(self.routes[layer].logits))) <= set(experts)
        return set(self.routes[layer].indices.tolist()) <= set(experts)

    def chosen_at(self, layer: int, experts: Sequence[int]) -> bool:
        """Whether the last position chose one of `experts` at that block."""
        return bool(set(self.routes[layer].indices.tolist()) & set(experts))


def _run(lm: LoadedModel, d: DirectLogits, out: Any, r: int, parts: tuple[Part, ...],
         means: Means | None, routed: Routed) -> AblatedRun:
    t = d.target
    logit = float(out.pre_cap[r, t])
    clean = ranked_token(lm, d.logits, t)
    logits = out.logits[r]
    probs = _softmax(logits)
    prob = float(probs[t])
    top_id = int(logits.argmax())
    direct = _direct(d, parts, means, routed)
    change = logit - d.model_logit
    return AblatedRun(
        parts=tuple(p.label for p in parts), logit=logit, prob=prob,
        rank=stats.rank(logits, t), logit_change=change, prob_change=prob - clean.prob,
        direct=direct, indirect=None if direct is None else change - direct,
        top=TopToken(1, top_id, lm.token_text(top_id), float(probs[top_id]),
                     float(logits[top_id])), experts=any(p.expert is not None for p in parts))


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.softmax(logits.float(), -1)


def _direct(d: DirectLogits, parts: tuple[Part, ...], means: Means | None, routed: Routed
            ) -> float | None:
    """Minus the parts' direct logit attribution (mean mode: of part minus its mean); for the
    experts of a block, the change their removal makes to the block's output at the last
    position (every input of the block unchanged), through the frozen final norm."""
    import torch

    contrib = {(k, l, h): v for k, l, h, v in d.parts}
    total = 0.0
    with torch.inference_mode():
        for layer, es in routed.by_layer(parts).items():
            total += float(d.value(routed.change(layer, es).to(d.u.device)))
        for p in parts:
            if p.expert is not None:
                continue
            if p.head is None:  # the MLP: whole, or its experts (a mixture of experts)
                value = sum(v for k, l, _, v in d.parts if l == p.layer
                            and k in MLP_PARTS)
                if means is not None:
                    value -= float(d.value(means.mlps[p.layer].to(d.u.device)))
            else:
                key = ("attn_head", p.layer, p.head)
                if key not in contrib:
                    return None
                value = contrib[key]
                if means is not None:
                    writes, _ = d.head_writes(p.layer, means.heads[p.layer])
                    value -= float(d.value(writes[p.head]))
            total -= value
    return total


def _check(lm: LoadedModel, d: DirectLogits, out: Any, r: int, parts: tuple[Part, ...],
           means: Means | None, worst: dict, failed: dict, routed: Routed) -> None:
    """At the first block the run changes: the attention output the stream received, the MoE
    output where only experts are removed there, and the block's decomposition (what it added
    = attention + MLP outputs)."""
    import torch

    fam = lm.parts.family
    L = min(p.layer for p in parts)
    heads = [p.head for p in parts if p.layer == L and p.head is not None]
    experts = routed.by_layer(parts).get(L, [])
    if experts and all(p.expert is not None for p in parts if p.layer == L):
        with torch.inference_mode():
            expected = d.cap.mlp_last[L][0].float() + routed.change(L, experts).to(
                d.cap.mlp_last[L][0].device)
            got = out.cap.mlp_last[L][r].float()
            gap = float((got - expected.to(got.device)).abs().max())
        bound = d.rtol * max(1.0, float(expected.abs().max()))
        _worst(worst, "expert", gap, bound, failed)
    cap, clean = out.cap, d.cap
    dtype = model_info(lm).dtype
    with torch.inference_mode():
        if heads:
            W, _ = d.w_o[L]
            hd = W.shape[1] // model_info(lm).n_heads
            y = d.y[L].to(W.device)
            fill = torch.zeros_like(y) if means is None else means.heads[L].to(W.device)
            delta = sum(W[:, h * hd:(h + 1) * hd] @ (fill[h * hd:(h + 1) * hd]
                                                      - y[h * hd:(h + 1) * hd]) for h in heads)
            if fam.attn_added:  # the model's own post-norm applied to the changed W_O output
                norm = lm.parts.attn_adds[L]
                o = (d.o[L].to(W.device) + delta).to(lm.dtype)
                expected = norm(o[None, None].to(next(norm.parameters()).device))[0, 0].float()
            else:
                expected = clean.attn_last[L][0] + delta
            got = cap.attn_last[L][r]
            gap = float((got - expected.to(got.device)).abs().max())
            bound = d.rtol * max(1.0, float(expected.abs().max()))
            _worst(worst, "attn", gap, bound, failed)
        pre = clean.embed_last[0] if L == 0 else clean.resid_last[L - 1][0]
        mismatch, bound = stats.decomposition(pre, cap.resid_last[L][r], cap.attn_last[L][r],
                                              cap.mlp_last[L][r], dtype)
        _worst(worst, "block", float(mismatch), float(bound), failed)


def _worst(worst: dict, key: str, gap: float, bound: float, failed: dict) -> None:
    if gap > bound:
        failed[key] = max(failed.get(key, 0.0), gap)
    if gap >= worst[key]:
        worst[key], worst[key + "_bound"] = gap, bound


def _checks(worst: dict, failed: dict, heads: bool, mlps: bool, rtol: float,
            experts: bool = False) -> list[Check]:
    out = []
    if experts:
        out.append(Check(
            name="what the MoE block output without the removed experts = its clean output "
            "with their weighted outputs taken out and the new weights' put in, each expert "
            "run alone by its own module (largest gap over the runs)",
            value=failed.get("expert", worst["expert"]),
            tolerance=f"≤ {rtol:g}·max(1, |expected|) = {worst['expert_bound']:.3g}",
            ok="expert" not in failed, target="ablated_experts"))
    if heads:
        out.append(Check(
            name="what the stream received from attention = the clean output with the removed "
            "heads' writes through W_O replaced (largest gap over the runs)",
            value=failed.get("attn", worst["attn"]),
            tolerance=f"≤ {rtol:g}·max(1, |expected|) = {worst['attn_bound']:.3g}",
            ok="attn" not in failed, target="ablated_attention"))
    out.append(Check(
        name="what the first changed block added = its attention + MLP outputs (largest gap)",
        value=failed.get("block", worst["block"]),
        tolerance=f"≤ {stats.DECOMPOSITION_RTOL:g}·‖Δ‖ + rounding = {worst['block_bound']:.3g}",
        ok="block" not in failed, target="ablated_block"))
    return out


def _notes(lm: LoadedModel, d: DirectLogits, mode: str, means: Means | None,
           runs: Sequence[tuple[Part, ...]], routed: Routed) -> list[str]:
    notes = base_notes(lm) + list(d.notes)
    if routed.layers:
        notes += _expert_notes(lm, runs, routed)
    if lm.parts.final_softcap is not None:
        notes.append(ABLATE_SOFTCAP(cap=lm.parts.final_softcap))
    removed = {p.layer for parts in runs for p in parts if p.head is not None}
    if any(d.w_o[layer][1] is not None for layer in removed):
        notes.append(ABLATE_WO_BIAS())
    if mode == "mean" and means is not None:
        notes.append(ABLATE_MEAN(n=means.positions))
    return notes


def _expert_notes(lm: LoadedModel, runs: Sequence[tuple[Part, ...]], routed: Routed
                  ) -> list[str]:
    """What the router does without the expert (the family's rule), and the experts the last
    position did not choose (their direct effect is 0)."""
    from fptrace.core.routing import moe_facts, renormalises

    moe = moe_facts(lm.parts, lm.config)
    assert moe is not None
    fam = lm.parts.family.title
    # (run's removal at one block, block) where the last position has no expert left to take
    emptied = [(", ".join(str(Expert(layer, e)) for e in gone), layer) for parts in runs
               for layer, gone in routed.by_layer(parts).items() if routed.none_left(layer, gone)]
    some_left = len(emptied) < sum(len(routed.by_layer(parts)) for parts in runs)
    out = []
    if routed.route == "next":
        out = [ABLATE_EXPERT_NEXT(family=fam)]
    elif some_left and renormalises(moe):
        out = [ABLATE_EXPERT_RENORM(family=fam, total=f"{moe.scale:g}")]
    elif some_left:
        out = [ABLATE_EXPERT_KEPT(family=fam)]
    out += [ABLATE_EXPERT_NONE_LEFT(removed=removed, block=layer)
            for removed, layer in dict.fromkeys(emptied)]
    unchosen = [str(Expert(p.layer, p.expert)) for parts in runs for p in parts
                if p.expert is not None and not routed.chosen_at(p.layer, [p.expert])]
    if unchosen:
        out.append(ABLATE_EXPERT_UNCHOSEN(experts=", ".join(dict.fromkeys(unchosen))))
    return out


def _ablate_latent(lm: LoadedModel, prompt: Prompt, sae: str | None, latent: int | None,
                   target: str | None, named: Callable[[str], str]) -> Ablation:
    """`--sae DIR --latent N`: at the output of the block the SAE reads, aᵢ·dᵢ (aᵢ its encoding
    of that output, position by position) is subtracted; one batch of two rows, the clean run
    and the ablated one. Direct effect: minus aᵢ·dᵢ at the last position through the frozen final
    norm. Checked: after that block, ablated − clean stream = −aᵢ·dᵢ at the last position."""
    import torch

    from fptrace.core.dictionaries import check_model, check_role, latent_block, read_dictionary
    from fptrace.core.interventions import latent_removal_hooks

    if sae is None or latent is None:
        raise BadInput(f"{param('sae')} DIR and {param('latent')} N go together: the latent of "
                       f"that SAE to remove")
    info = model_info(lm)
    dic = read_dictionary(sae)
    check_role(dic, "sae")
    check_model(dic, info.n_layers, info.d_model, lm.name)
    block, row = latent_block(dic, latent)
    dic.to(lm.device)
    d = direct_logits(lm, prompt, target=target, named=named)
    t = d.target
    store: dict = {}
    hooks = latent_removal_hooks(lm, block, lambda h: dic.encode(h.reshape(-1, h.shape[-1])
                                                                 )[:, latent].reshape(h.shape[:2]),
                                 row.to(lm.device), [1], store)
    out = run_rows(lm, d.ids, 2, hooks, LOWER)
    a_last = float(store["a"][0, -1])
    with torch.inference_mode():
        direct = -float(d.value(a_last * row.to(d.u.device)))
        h = out.cap.resid_last[block]  # (2, d)
        expected = -a_last * row.to(h.device)
        gap = float(((h[1] - h[0]) - expected).abs().max())
    bound = d.rtol * max(1.0, float(h.abs().max()))
    logit = float(out.pre_cap[1, t])
    clean = ranked_token(lm, d.logits, t)
    probs = _softmax(out.logits[1])
    top_id = int(out.logits[1].argmax())
    change = logit - d.model_logit
    run = AblatedRun(
        parts=(f"latent {latent} ({hook_name(dic.out_site)})",), logit=logit,
        prob=float(probs[t]),
        rank=stats.rank(out.logits[1], t), logit_change=change,
        prob_change=float(probs[t]) - clean.prob, direct=direct, indirect=change - direct,
        top=TopToken(1, top_id, lm.token_text(top_id), float(probs[top_id]),
                     float(out.logits[1, top_id])))
    check = Check(
        name=f"after block {block}, ablated − clean stream at the last position = −aᵢ·dᵢ "
        f"(aᵢ = {a_last:.4g})", value=gap, tolerance=f"≤ {d.rtol:g}·max(1, |x|) = {bound:.3g}",
        ok=gap <= bound, target="ablated_latent")
    notes = base_notes(lm) + list(d.notes)
    if lm.parts.final_softcap is not None:
        notes.append(ABLATE_SOFTCAP(cap=lm.parts.final_softcap))
    return Ablation(
        prompt=d.prepared.text, model=info, tokens=lm.tokens(d.prepared), mode="zero",
        mean_over=None, mean_positions=None, target=clean, clean_logit=d.model_logit,
        runs=(run,), head_grid=(), mlp_column=(), largest=(), checks=(check,), ok=check.ok,
        forward_passes=2, notes=tuple(notes))
