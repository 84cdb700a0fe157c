"""`fptrace features`: the stream read through sparse dictionaries, with the part each misses.

One forward pass captures, at every position, what each dictionary reads (the stream before or
after a block, the MLP's input or output). The dictionary encodes it as its format does
(dictionary.py); the decomposition

    x = Σ aᵢ·dᵢ (over the active latents) + b_dec + error

(for a skip transcoder, whose output has an affine term beside the latents, y = Σ aᵢ·dᵢ +
x_in·W_skip + b_dec + error, the skip term its own line) is then exact by construction of the
error term, and checked on every run in float64 (to 1e-6
relative at every position: a latent left out of the table would show there). The target's logit
at the last position is split through it: the stream entering the final norm is the site plus
what the later parts added (`rest`), the final norm is frozen at its actual value (as `fptrace
attribute` does: core/attribution.py), so every latent, b_dec, the error and the rest are each a
number of logits, and with the norm's and LM head's biases they sum to the model's own logit; the
split is withheld, with the measured gap, where they do not.

Positions whose vector is over ten times the median norm (the massive activation at the first
token: ~22,660 after block 15 of the bundled model against 170-190 elsewhere) are decomposed like
the others but left out of the FVU, and named in a note with their own error.

A dictionary put at the wrong place reads vectors it was not trained on: besides the checks of
the config against the model (dictionary.py), the FVU at its site is compared with the stream one
block before and after it; a dictionary that reconstructs a neighbour well and its own site badly
is refused, naming both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fptrace.addresses import Site
from fptrace.commands.features.notes import ATTRIBUTION_WITHHELD, MASSIVE, NOT_IN_STREAM, SOFTCAP
from fptrace.commands.features.result import (
    DictionaryReadout,
    FeatureAttribution,
    Features,
    LatentTerm,
    LatentTrace,
    LatentValue,
    PositionFeatures,
    TopActivation,
)
from fptrace.commands.features.streams import Captured, capture, stream_index
from fptrace.core.attribution import frozen_norm, rtol_for, through_frozen
from fptrace.core.dictionaries import Dictionary, check_model, check_role, read_dictionary
from fptrace.core.dictionary_sites import MLP_IN, hook_name
from fptrace.core.fragments import token_id
from fptrace.core.trace import base_notes, model_info, ranked_token
from fptrace.errors import BadInput, param
from fptrace.results import Check

if TYPE_CHECKING:
    import torch

    from fptrace.models.loading import LoadedModel
    from fptrace.models.prompts import Prompt

DECOMPOSITION_RTOL = 1e-6
MASSIVE_RATIO = 10.0
# the wrong-site guard: the site's FVU above this while a neighbouring stream's is below
# NEIGHBOUR_FVU (and a fifth of the site's)
SITE_FVU = 0.2
NEIGHBOUR_FVU = 0.1


def load_dictionaries(lm: LoadedModel, saes: Sequence[str | Dictionary] = (),
                      transcoders: Sequence[str | Dictionary] = (), site: str | None = None
                      ) -> list[Dictionary]:
    """Each --sae and --transcoder read (or taken as given), its role and place checked against
    the option and the model."""
    info = model_info(lm)
    out = []
    for given, role, option in [(s, "sae", "--sae") for s in saes] + \
            [(t, "transcoder", "--transcoder") for t in transcoders]:
        d = given if isinstance(given, Dictionary) else read_dictionary(str(given), site=site)
        check_role(d, role, option)
        check_model(d, info.n_layers, info.d_model, lm.name, option,
                    norm_after_mlp=bool(lm.parts.family.mlp_added))
        out.append(d)
    if not out:
        raise BadInput(f"give a dictionary: {param('sae')} DIR (an SAE of the stream) or "
                       f"{param('transcoder')} DIR")
    return out


def check_latent(dicts: Sequence[Dictionary], latent: int | None) -> None:
    if latent is None:
        return
    for d in dicts:
        if not 0 <= latent < d.d_sae:
            raise BadInput(f"{param('latent')} {latent}: {d.path!r} has latents 0 to {d.d_sae - 1}")


def features(lm: LoadedModel, prompt: Prompt, *, saes: Sequence[str | Dictionary] = (),
             transcoders: Sequence[str | Dictionary] = (), site: str | None = None, top: int = 5,
             latent: int | None = None, target: str | None = None,
             top_prompts: str | None = None, top_n: int = 10, batch_size: int = 8) -> Features:
    """Read the prompt through each dictionary (see the module's text)."""
    import torch

    if top < 1:
        raise BadInput(f"{param('top')} {top}: must be at least 1")
    if top_prompts is not None and latent is None:
        raise BadInput(f"{param('top_prompts')} needs {param('latent')} N: the latent whose "
                       f"largest activations "
                       "are listed")
    dicts = load_dictionaries(lm, saes, transcoders, site)
    check_latent(dicts, latent)
    info = model_info(lm)
    prepared = lm.prepare(prompt)
    ids = list(prepared.ids)
    streams, sites = _wanted(dicts, info.n_layers)
    cap = capture(lm, torch.tensor([ids], device=lm.device), streams, sites, attribution=True)
    t = int(cap.logits_last[0].argmax()) if target is None else \
        token_id(lm, target, "--target", prepared)
    notes = base_notes(lm)
    if lm.parts.final_softcap:
        notes.append(SOFTCAP(cap=lm.parts.final_softcap))
    readouts = []
    with torch.inference_mode():
        for d in dicts:
            d.to(lm.device)
            _guard_site(d, cap, info.n_layers)
            readouts.append(_readout(lm, d, cap, t, top, latent, notes))
    checks = tuple(Check(
        name=f"{r.out_site}: Σ aᵢ·dᵢ + {'x_in·W_skip + ' if r.skip else ''}b_dec + error = "
             "the vector read, every position",
        value=r.decomposition_gap, tolerance=f"≤ {DECOMPOSITION_RTOL:g} relative",
        ok=r.decomposition_gap <= DECOMPOSITION_RTOL, target="decomposition") for r in readouts)
    found: tuple[TopActivation, ...] = ()
    read = 0
    if top_prompts is not None:
        found, read = largest(lm, dicts[0], latent, top_prompts, top_n, batch_size)
    return Features(prompt=prepared.text, model=info, tokens=lm.tokens(prepared),
                    dictionaries=tuple(readouts), top_prompts=found, prompts_read=read,
                    checks=checks, ok=all(c.ok for c in checks), notes=tuple(notes))


def _wanted(dicts: Sequence[Dictionary], n_layers: int) -> tuple[set[int], set[Site]]:
    """The stream numbers (each resid site and its neighbours) and the MLP sites to capture."""
    streams: set[int] = set()
    sites: set[Site] = set()
    for d in dicts:
        for s in (d.site, d.out_site):
            i = stream_index(s)
            if i is None:
                sites.add(s)
            else:
                streams |= {j for j in (i - 1, i, i + 1) if 0 <= j <= n_layers}
    return streams, sites


def fvu(x: torch.Tensor, err: torch.Tensor) -> float | None:
    """Σ‖err‖² / Σ‖x − mean x‖² over the rows; None with fewer than two rows."""
    if x.shape[0] < 2:
        return None
    var = float(((x - x.mean(0)) ** 2).sum())
    return float((err ** 2).sum()) / var if var > 0 else None


def massive_rows(norms: torch.Tensor) -> torch.Tensor:
    """(T,) bool: the positions whose norm is over MASSIVE_RATIO × the median (three positions
    or more)."""
    import torch

    if norms.shape[0] < 3:
        return torch.zeros_like(norms, dtype=torch.bool)
    return norms > MASSIVE_RATIO * norms.median()


def _guard_site(d: Dictionary, cap: Captured, n_layers: int) -> None:
    """Refuse an SAE that reconstructs a neighbouring stream well and its own site badly."""
    i = stream_index(d.site)
    if d.role != "sae" or i is None:
        return

    def at(j: int) -> float | None:
        x = cap.streams[j][0].double()
        keep = ~massive_rows(x.norm(dim=-1))
        x = x[keep]
        err = x - d.decode(d.encode(x.float())).double()
        return fvu(x, err)

    own = at(i)
    if own is None or own <= SITE_FVU:
        return
    for j in (i - 1, i + 1):
        if 0 <= j <= n_layers and j in cap.streams:
            other = at(j)
            if other is not None and other < NEIGHBOUR_FVU and other < own / 5:
                name = "the embedding" if j == 0 else f"blocks.{j - 1}.hook_resid_post"
                raise BadInput(
                    f"{param('sae')} {d.path!r} is read at {hook_name(d.site)} as its config "
                    f"says, but it "
                    f"reconstructs the stream there with FVU {own:.3g} and {name} with FVU "
                    f"{other:.3g}: it was trained one place off; fix its hook name")


def _readout(lm: LoadedModel, d: Dictionary, cap: Captured, t: int, top: int, latent: int | None,
             notes: list) -> DictionaryReadout:
    import torch

    x_in = cap.at(d.site)[0]  # (T, d_in) float32
    y = cap.at(d.out_site)[0].double()  # (T, d_out) what it reconstructs
    a = d.encode(x_in)  # (T, d_sae) float32, as the format computes it
    a64 = a.double()
    W_dec, b_dec = d.W_dec.double(), d.b_dec.double()
    skip = d.skip(x_in.double())  # (T, d_out) a skip transcoder's x·W_skip; zeros without one
    err = y - (a64 @ W_dec + b_dec + skip)  # (T, d_out)
    T = y.shape[0]
    norms = y.norm(dim=-1)  # (T,)
    gap = 0.0
    positions = []
    massive = massive_rows(norms)
    for p in range(T):
        idx = torch.nonzero(a[p]).flatten()
        rebuilt = a64[p, idx] @ W_dec[idx] + skip[p] + b_dec + err[p]  # (d_out,) the active ones
        gap = max(gap, float((rebuilt - y[p]).norm()) / max(float(norms[p]), 1e-30))
        vals, order = a[p].topk(min(top, d.d_sae))
        positions.append(PositionFeatures(
            position=p, norm=float(norms[p]), error_norm=float(err[p].norm()),
            relative_error=float(err[p].norm() ** 2 / max(float(norms[p]) ** 2, 1e-30)),
            l0=int(idx.numel()), massive=bool(massive[p]),
            top=tuple(LatentValue(int(i), float(v)) for v, i in zip(vals, order) if v != 0),
            skip_norm=float(skip[p].norm()) if d.W_skip is not None else None))
    keep = ~massive
    if bool(massive.any()):
        med = float(norms[keep].median()) if bool(keep.any()) else float(norms.median())
        for p in torch.nonzero(massive).flatten().tolist():
            notes.append(MASSIVE(site=hook_name(d.out_site), positions=p, norm=float(norms[p]),
                                 ratio=float(norms[p]) / med,
                                 error=positions[p].relative_error))
    trace = None
    if latent is not None:
        trace = LatentTrace(latent=latent, activations=tuple(float(v) for v in a[:, latent]),
                            decoder_norm=float(d.W_dec[latent].norm()))
    return DictionaryReadout(
        path=d.path, format=d.format, activation=d.kind, role=d.role, site=hook_name(d.site),
        out_site=hook_name(d.out_site), d_sae=d.d_sae, k=d.k, positions=tuple(positions),
        fvu=fvu(y[keep], err[keep]), l0=float((a != 0).sum(-1).double().mean()),
        decomposition_gap=gap, attribution=_attribution(lm, d, cap, a64[-1], err[-1], y[-1], t,
                                                        top, notes, skip[-1]),
        latent=trace, skip=d.W_skip is not None)


def _attribution(lm: LoadedModel, d: Dictionary, cap: Captured, a: torch.Tensor, err: torch.Tensor,
                 y: torch.Tensor, t: int, top: int, notes: list, skip: torch.Tensor
                 ) -> FeatureAttribution | None:
    """The target's logit split through the dictionary at the last position (module text);
    `skip` (d_out,) a skip transcoder's x·W_skip there (zeros without one)."""
    import torch

    if d.out_site.point is MLP_IN:
        notes.append(NOT_IN_STREAM(site=hook_name(d.out_site)))
        return None
    fam = lm.parts.family
    x = cap.final_last[0]  # (d,) float32, the stream entering the final norm
    centre, gain, norm_bias = frozen_norm(lm.parts.final_norm, x, fam.norm_type)
    gain = gain.double()
    u = lm.parts.lm_head.weight.detach()[t].double().to(x.device)  # (d,)

    def value(v: torch.Tensor) -> torch.Tensor:  # (..., d) -> (...) logits
        return through_frozen(v.double(), centre, gain) @ u

    idx = torch.nonzero(a).flatten()
    terms = a[idx] * value(d.W_dec.double()[idx])  # (n_active,)
    b_term = float(value(d.b_dec))
    e_term = float(value(err))
    s_term = float(value(skip))
    rest = float(value(x.double() - y))
    biases = 0.0 if norm_bias is None else float(norm_bias.double() @ u)
    head_bias = getattr(lm.parts.lm_head, "bias", None)
    if head_bias is not None:
        biases += float(head_bias[t])
    latent_sum = float(terms.sum())
    total = latent_sum + s_term + b_term + e_term + rest + biases
    model_logit = float(cap.logits_last[0, t])
    scale = max(1.0, float(terms.abs().sum()) + abs(s_term) + abs(b_term) + abs(e_term) +
                abs(rest) + abs(biases))
    rtol = rtol_for(model_info(lm).dtype)
    tolerance = f"|total − logit| ≤ {rtol:g}·max(1, Σ|terms|) = {rtol * scale:.3g}"
    if abs(total - model_logit) > rtol * scale:
        notes.append(ATTRIBUTION_WITHHELD(site=hook_name(d.out_site), total=total,
                                          logit=model_logit, difference=total - model_logit,
                                          tolerance=tolerance))
        return None
    order = terms.abs().argsort(descending=True)[:top]
    listed = [LatentTerm(int(idx[i]), float(a[idx[i]]), float(terms[i])) for i in order]
    logits = cap.logits_last[0].double()
    if lm.parts.final_softcap:
        c = lm.parts.final_softcap
        logits = torch.tanh(logits / c) * c
    return FeatureAttribution(
        target=ranked_token(lm, logits, t), model_logit=model_logit, latents=tuple(listed),
        other_latents=latent_sum - sum(x.logits for x in listed), latent_sum=latent_sum,
        b_dec=b_term, error=e_term, rest=rest, biases=biases, total=total,
        difference=total - model_logit, tolerance=tolerance,
        skip=s_term if d.W_skip is not None else None)


def largest(lm: LoadedModel, d: Dictionary, latent: int, path: str, n: int, batch_size: int
            ) -> tuple[tuple[TopActivation, ...], int]:
    """The n places over the prompts of `path` where the latent is largest, streamed a group of
    prompts at a time (core/inputs.py, core/prompt_groups.py, as `stats` reads them)."""
    import heapq

    import torch

    from fptrace.core.inputs import read_inputs
    from fptrace.core.prompt_groups import Summary, run_groups
    from fptrace.core.trace import padded_batch

    if n < 1:
        raise BadInput(f"{param('top_n')} {n}: must be at least 1")
    items = read_inputs([path])
    heap: list[tuple[float, int, str, int, str, str]] = []
    counter = [0]
    streams, sites = set(), set()
    i = stream_index(d.site)
    if i is None:
        sites.add(d.site)
    else:
        streams.add(i)

    def work(group: list) -> list:
        rows = [list(e.ids) for e in group]
        input_ids, mask, kwargs = padded_batch(lm, rows)
        cap = capture(lm, input_ids, streams, sites, **kwargs)
        x = cap.at(d.site)  # (B, T, d_in)
        T = x.shape[1]
        out = []
        for r, e in enumerate(group):
            m = len(rows[r])
            acts = d.encode(x[r, T - m:])[:, latent]  # (m,) this prompt's real positions
            out.append((e, acts.tolist()))
        return out

    def emit(chunk: list, results: list, failures: dict) -> None:
        for res in results:
            for e, acts in res:
                for p, v in enumerate(acts):
                    if v <= 0:
                        continue
                    counter[0] += 1
                    entry = (float(v), -counter[0], e.item.id, p, lm.token_text(e.ids[p]),
                             lm.prompt_text(list(e.ids[:p + 1]))[-60:])
                    if len(heap) < n:
                        heapq.heappush(heap, entry)
                    else:
                        heapq.heappushpop(heap, entry)

    summary = Summary(total=len(items))
    with torch.inference_mode():
        run_groups(lm, items, work, emit, summary=summary, batch_size=batch_size,
                   truncate=True)
    found = sorted(heap, reverse=True)
    return tuple(TopActivation(prompt_id=pid, position=p, token=tok, activation=v, context=ctx)
                 for v, _, pid, p, tok, ctx in found), summary.traced


__all__ = ["check_latent", "features", "fvu", "largest", "load_dictionaries", "massive_rows"]
