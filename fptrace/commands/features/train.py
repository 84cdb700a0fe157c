"""`fptrace features train`: a TopK SAE trained on the stream after one block, written in the
SAELens layout (cfg.json + sae_weights.safetensors), so that SAELens and fptrace both read it.

1. The stream after block L is collected from the prompts (core/inputs.py, a group of prompts a
   forward pass: core/prompt_groups.py, as `stats` reads them). The first position of every
   prompt is left out, as SAE trainers commonly do: it holds the massive activation (norm
   ~22,660 after block 15 of the bundled model against 170-190 elsewhere), which would dominate
   the squared error. A tenth of the prompts (at least one) is held out for the evaluation.
2. TopK SAE (Gao et al. 2024): a = TopK(relu((x − b_dec) W_enc + b_enc)), x̂ = a W_dec + b_dec,
   decoder rows kept at unit norm, W_enc initialised as W_dec's transpose, b_dec as the mean of
   the first batch; loss: ‖x − x̂‖² / ‖x − mean‖² (the batch's FVU) plus the AuxK loss (the
   top k_aux latents that have not fired for `dead_after` tokens rebuild the residual, × 1/32).
   Adam; the data are shuffled by a seeded generator, one epoch after another until `tokens`
   training tokens have been seen.
3. Every `save_every` steps (and at the end) the SAE, Adam's moments and the step are written to
   the output folder (trainer_state.safetensors + trainer_state.json, no pickle); `resume`
   continues from there with the same data order, so an interrupted run ends where an
   uninterrupted one would. The state names what it was trained from: the options, the model's
   weights (their fingerprint, as `stats` keeps it: models/fingerprint.py) and the prompts (a
   digest of their ids and texts); a resume with other options, other weights (another model of
   the same width) or other prompts is refused before the stream is collected, naming what
   differs.
4. On the held-out prompts: FVU, L0 and the dead latents (those that fire on no held-out token).

Memory (float32, measured by peak RSS on the tiny GPT-2 with 10k and 100k latents): the SAE
costs about ten copies of its 2·d·n + n + d numbers (the weights, their gradients, Adam's two
moments, Adam's temporaries, and at a checkpoint the clones and serialised bytes of weights and
moments), a step about two (batch, n) tensors (most of its (batch, n) tensors are zeros with k
values scattered in, whose pages are never touched), and the stream a row of d per position,
twice while it is collected (the rows and their concatenation). `check_memory` refuses, before
the model is loaded, a training that would pass 80% of the CPU's free memory (OutOfMemory, exit
3), the positions estimated from the prompts' text.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fptrace.addresses import Site
from fptrace.atomic import write_atomic
from fptrace.commands.features.result import TrainResult
from fptrace.commands.features.streams import capture, stream_index
from fptrace.core.dictionary_sites import hook_name
from fptrace.core.trace import model_info
from fptrace.errors import BadInput, OutOfMemory, param
from fptrace.points import Point

if TYPE_CHECKING:
    import torch

    from fptrace.core.inputs import PromptItem
    from fptrace.models.loading import LoadedModel

STATE = "trainer_state.safetensors"
STATE_JSON = "trainer_state.json"


def atomic_write(path: str, data: bytes) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    write_atomic(path, write)


@dataclass(frozen=True)
class TrainOptions:
    layer: int
    latents: int = 2048
    k: int = 32
    tokens: int = 200_000
    batch_tokens: int = 1024
    lr: float = 5e-4
    seed: int = 0
    held_out: float = 0.1
    save_every: int = 200
    dead_after: int = 50_000
    skip: bool = False  # a transcoder's affine term x·W_skip beside the latents (transcoders.py)


def check_options(opts: TrainOptions) -> None:
    """The options on their own (the block is checked against the model in `train`)."""
    for name, v, low in (("--latents", opts.latents, 2), ("--k", opts.k, 1),
                         ("--tokens", opts.tokens, 1), ("--batch-tokens", opts.batch_tokens, 1)):
        if v < low:
            raise BadInput(f"{name} {v}: must be at least {low}")
    if opts.k >= opts.latents:
        raise BadInput(f"{param('k')} {opts.k}: must be below {param('latents')} ({opts.latents})")
    if not 0 < opts.held_out < 1:
        raise BadInput(f"{param('held_out')} {opts.held_out}: a fraction between 0 and 1")


BYTES_PER_TOKEN = 4  # of UTF-8 text, the usual rate of BPE tokenizers on English prose


def estimated_positions(items: Sequence[PromptItem]) -> int:
    """The positions the prompts will give, estimated from their text (before any tokenizer is
    loaded): one per BYTES_PER_TOKEN bytes, at least one a prompt."""
    from fptrace.core.inputs import prompt_to_json

    return sum(max(1, len(prompt_to_json(it.prompt).encode()) // BYTES_PER_TOKEN)
               for it in items if it.prompt is not None)


def training_bytes(d: int, opts: TrainOptions, positions: int, rows: int = 1
                   ) -> dict[str, int]:
    """The float32 bytes the training holds at its peak (see the module's text for the
    measured multiples): `sae` (the weights, gradients, Adam's moments and a checkpoint), `step`
    (one step's (b, n) tensors) and `stream` (the collected positions: `rows` vectors of d a
    position, 1 for an SAE, 2 for a transcoder: the MLP's input and output)."""
    n, b = opts.latents, min(opts.batch_tokens, max(positions, 1))
    skip = d * d if opts.skip else 0  # a skip transcoder's W_skip
    return {"sae": 10 * 4 * (2 * d * n + n + d + skip), "step": 2 * 4 * b * n,
            "stream": 4 * positions * d * rows}


def check_memory(d: int, opts: TrainOptions, positions: int, transcoder: bool = False) -> None:
    """Refuse a training whose memory (training_bytes) passes 80% of the CPU's free memory, in
    one line naming its parts and what to lower: OutOfMemory, exit 3. A transcoder holds one
    block's MLP input and output (the rest of the collection waits on disk)."""
    import torch

    from fptrace.models.memory import available_bytes, human_bytes

    part = training_bytes(d, opts, positions, 2 if transcoder else 1)
    # while collecting, an SAE's stream is held twice (the rows and their concatenation)
    need = sum(part.values()) if transcoder else max(sum(part.values()), 2 * part["stream"])
    free = available_bytes(torch.device("cpu"))
    what = "SAE" if not transcoder else "transcoder"
    rows = "the stream of" if not transcoder else "one block's MLP input and output at"
    if free is not None and need > 0.8 * free:
        raise OutOfMemory(
            f"features train needs about {human_bytes(need)} of memory (the {what} of "
            f"{opts.latents} latents × d_model {d} with its gradients, Adam's moments and a "
            f"checkpoint {human_bytes(part['sae'])}, a step {human_bytes(part['step'])}, {rows} "
            f"about {positions} positions {human_bytes(part['stream'])}) but "
            f"{human_bytes(free)} is free on the CPU, where the {what} is trained: lower "
            f"{param('latents')} or {param('batch_tokens')}, or train on fewer prompts")


def model_sizes(model: str) -> tuple[int, int, str] | None:
    """(d_model, blocks, the model's name as a load names it) from the model's config where it
    can be read without its weights (a GGUF file or a hub snapshot not yet fetched: None, and
    the training checks once loaded)."""
    from fptrace.models.registry import resolve
    from fptrace.models.sources import load_config

    spec = resolve(model)
    if spec.kind in ("gguf", "hub") and spec.known is None:
        return None
    config = load_config(spec)
    d = int(getattr(config, "hidden_size", 0) or 0)
    n = int(getattr(config, "num_hidden_layers", 0) or 0)
    return (d, n, spec.name) if d > 0 else None


def check_before_load(opts: TrainOptions, inputs: Sequence[str], model: str) -> list:
    """What the command line checks before the model is loaded: the options, the prompts (read
    whole, once: they are returned for `train`, stdin included) and the memory, with d_model
    from the model's config where it can be read without its weights (model_sizes)."""
    from fptrace.core.inputs import read_inputs

    check_options(opts)
    items = read_inputs(list(inputs))
    sizes = model_sizes(model)
    if sizes is not None:
        check_memory(sizes[0], opts, estimated_positions(items))
    return items


def split_held_out(items: Sequence[PromptItem], opts: TrainOptions) -> tuple[list, list]:
    """(kept, held): a seeded tenth of the prompts (opts.held_out, at least one) held out for
    the evaluation, each part in the prompts' order."""
    import torch

    n_held = max(1, int(round(len(items) * opts.held_out)))
    g = torch.Generator().manual_seed(opts.seed)
    order = torch.randperm(len(items), generator=g).tolist()
    return [items[i] for i in sorted(order[n_held:])], [items[i] for i in sorted(order[:n_held])]


def inputs_digest(items: Sequence[PromptItem]) -> str:
    """A digest of the training prompts (ids and texts, in order): what a resume must find
    again."""
    import hashlib

    from fptrace.core.inputs import prompt_to_json

    h = hashlib.blake2b(digest_size=16)
    for it in items:
        h.update(json.dumps([it.id, None if it.prompt is None else prompt_to_json(it.prompt),
                             it.error]).encode())
    return h.hexdigest()


def collect(lm: LoadedModel, items: Sequence[PromptItem], layer: int,
            progress: Callable | None = None, batch_size: int = 8
            ) -> tuple[torch.Tensor, list[int]]:
    """(N, d) float32 on the CPU: the stream after `layer` at every position but each prompt's
    first, and the number of positions each prompt gave (in order)."""
    import torch

    from fptrace.core.prompt_groups import Summary, run_groups
    from fptrace.core.trace import padded_batch

    i = stream_index(Site(layer, Point.resid_post))
    rows: list[torch.Tensor] = []
    counts: list[int] = []

    def work(group: list) -> list:
        ids = [list(e.ids) for e in group]
        input_ids, mask, kwargs = padded_batch(lm, ids)
        cap = capture(lm, input_ids, {i}, set(), **kwargs)
        x = cap.streams[i].cpu()  # (B, T, d)
        T = x.shape[1]
        return [x[r, T - len(ids[r]) + 1:] for r in range(len(group))]  # first position left out

    def emit(chunk: list, results: list, failures: dict) -> None:
        for res in results:
            for x in res:
                rows.append(x)
                counts.append(int(x.shape[0]))

    summary = Summary(total=len(items))
    with torch.inference_mode():
        run_groups(lm, items, work, emit, summary=summary, batch_size=batch_size, truncate=True,
                   progress=progress)
    if summary.interrupted:  # run_groups stops between groups: the stream is not whole
        raise KeyboardInterrupt
    if not rows or sum(counts) == 0:
        raise BadInput("the prompts give no positions to train on (each prompt's first position "
                       "is left out: give prompts of two tokens or more)")
    return torch.cat(rows).float(), counts


PARAMS = ("W_enc", "b_enc", "W_dec", "b_dec")


class TopK:
    """The SAE being trained (float32, CPU); with `skip` (a skip transcoder), W_skip (d_in,
    d_out) adds x·W_skip to the output, started at zero."""

    def __init__(self, d: int, n: int, k: int, seed: int, shift_input: bool = True,
                 skip: bool = False) -> None:
        import torch

        g = torch.Generator().manual_seed(seed)
        W_dec = torch.randn(n, d, generator=g)
        W_dec /= W_dec.norm(dim=-1, keepdim=True)
        self.W_dec = W_dec.requires_grad_()
        self.W_enc = W_dec.detach().T.clone().contiguous().requires_grad_()
        self.b_enc = torch.zeros(n, requires_grad=True)
        self.b_dec = torch.zeros(d, requires_grad=True)
        self.k = k
        # an SAE encodes x − b_dec; a transcoder's b_dec lives in the output's space, so its
        # input is encoded as it is (SAELens's transcoders: apply_b_dec_to_input false)
        self.shift_input = shift_input
        self.W_skip = torch.zeros(d, d, requires_grad=True) if skip else None

    def named(self) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) of every trained tensor, in Adam's order: PARAMS, then W_skip."""
        out = list(zip(PARAMS, (self.W_enc, self.b_enc, self.W_dec, self.b_dec)))
        return out + ([("W_skip", self.W_skip)] if self.W_skip is not None else [])

    def params(self) -> list:
        return [t for _, t in self.named()]

    def out(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The output from the activations a (b, n) of the inputs x (b, d_in): a·W_dec + b_dec,
        plus x·W_skip for a skip transcoder."""
        y = a @ self.W_dec + self.b_dec
        return y if self.W_skip is None else y + x @ self.W_skip

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        x_in = x - self.b_dec if self.shift_input else x
        return torch.relu(x_in @ self.W_enc + self.b_enc)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        pre = self.pre(x)
        vals, idx = pre.topk(self.k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, idx, vals)

    def normalise(self) -> None:
        import torch

        with torch.no_grad():
            self.W_dec /= self.W_dec.norm(dim=-1, keepdim=True).clamp(min=1e-12)


def train(lm: LoadedModel, inputs: Sequence[str], out: str, opts: TrainOptions, *,
          resume: bool = False, progress: Callable[[str, int, int], None] | None = None,
          items: Sequence[PromptItem] | None = None) -> TrainResult:
    """Train and write the SAE (see the module's text). progress(phase, done, total): phase
    `prompts` while collecting (done in prompts), `steps` while training. `items`: the prompts
    of `inputs` already read (check_before_load's), so that stdin is read once."""
    from fptrace.core.inputs import read_inputs
    from fptrace.models.fingerprint import weights_fingerprint

    info = model_info(lm)
    if not 0 <= opts.layer < info.n_layers:
        raise BadInput(f"{param('layer')} {opts.layer}: {lm.name} has blocks 0 to "
                       f"{info.n_layers - 1}")
    check_options(opts)
    check_out(out, resume)
    items = list(items) if items is not None else read_inputs(list(inputs))
    if len(items) < 2:
        raise BadInput("give two prompts or more: a tenth of them (at least one) is held out")
    check_memory(info.d_model, opts, estimated_positions(items))
    source = {"model": lm.name, "weights": weights_fingerprint(lm),
              "inputs": inputs_digest(items), "prompts": len(items)}
    doc = resumed_state(out, opts, source) if resume else None
    kept, held = split_held_out(items, opts)
    tick = None if progress is None else (lambda p, t: progress("prompts", p, len(items)))
    x_train, _ = collect(lm, kept, opts.layer, tick)
    x_held, _ = collect(lm, held, opts.layer, tick)
    sae = TopK(x_train.shape[1], opts.latents, opts.k, opts.seed)
    t0 = time.perf_counter()
    steps, resumed_from, losses = fit(sae, x_train, x_train, out, opts, source, doc,
                                      None if progress is None else
                                      (lambda done, total: progress("steps", done, total)))
    fvu, l0, dead = evaluate(sae, x_held, x_held)
    write_saelens_folder(out, sae, opts, lm)
    curve = tuple(float(v) for v in losses[::max(1, len(losses) // 50)])
    return TrainResult(
        out=out, model=info, layer=opts.layer, site=hook_name(Site(opts.layer, Point.resid_post)),
        latents=opts.latents, k=opts.k, prompts=len(kept), held_out_prompts=len(held),
        train_tokens=int(x_train.shape[0]), held_out_tokens=int(x_held.shape[0]),
        steps=steps, resumed_from=resumed_from, tokens_seen=steps * opts.batch_tokens,
        first_loss=float(losses[0]) if losses else float("nan"),
        last_loss=float(sum(losses[-10:]) / len(losses[-10:])) if losses else float("nan"),
        loss_curve=curve, fvu=fvu, l0=l0, dead_latents=dead,
        seconds=time.perf_counter() - t0)


def fit(sae: TopK, x_train: torch.Tensor, y_train: torch.Tensor, out: str, opts: TrainOptions,
        source: dict, doc: dict | None, tick: Callable[[int, int], None] | None = None
        ) -> tuple[int, int, list]:
    """Train `sae` to rebuild y_train (N, d_out) from x_train (N, d_in) (the same tensor for an
    SAE), saving its state in `out` every save_every steps and at the end; `doc`: the state of
    an interrupted run to continue (resumed_state's), None for a fresh one. (steps, the step
    resumed from, the losses)."""
    import torch

    adam = torch.optim.Adam(sae.params(), lr=opts.lr)
    steps = max(1, opts.tokens // opts.batch_tokens)
    step, since_fired = 0, torch.zeros(opts.latents, dtype=torch.long)
    losses: list[float] = []
    if doc is not None:
        step, losses = _load_state(out, doc, sae, adam, since_fired)
    else:
        with torch.no_grad():
            if sae.W_skip is not None:  # the skip starts as the least-squares affine map
                W, b = least_squares(x_train, y_train)
                sae.W_skip.copy_(W)
                sae.b_dec.copy_(b)
            else:
                sae.b_dec.copy_(y_train[:opts.batch_tokens].mean(0))
    resumed_from = step
    n = x_train.shape[0]
    data = torch.Generator().manual_seed(opts.seed + 1)
    perm = torch.randperm(n, generator=data)
    for _ in range(step * opts.batch_tokens // n):  # epochs already done
        perm = torch.randperm(n, generator=data)
    while step < steps:
        idx = _batch(perm, step * opts.batch_tokens % n, opts.batch_tokens)
        x = x_train[idx]  # (b, d_in)
        y = x if y_train is x_train else y_train[idx]  # (b, d_out)
        loss, fired = _step(sae, adam, x, y, since_fired, opts)
        since_fired += idx.shape[0]
        since_fired[fired] = 0
        losses.append(loss)
        step += 1
        if (step * opts.batch_tokens) // n != ((step - 1) * opts.batch_tokens) // n:
            perm = torch.randperm(n, generator=data)  # a new epoch
        if step % opts.save_every == 0 or step == steps:
            _save(out, sae, adam, since_fired, step, losses, opts, source)
        if tick is not None:
            tick(step, steps)
    return steps, resumed_from, losses


MASSIVE = 20.0  # least_squares leaves out the rows whose output's norm passes this × the median


def least_squares(x: torch.Tensor, y: torch.Tensor, chunk: int = 16_384
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(W (d_in, d_out), b (d_out,)) float32: the affine map x·W + b nearest to y (N, d_out) in
    squared error over the rows of x (N, d_in), from the normal equations of the centred rows
    accumulated in float64 a chunk at a time (a tiny ridge, 1e-6 of the mean variance, keeps a
    rank-deficient x solvable). The rows whose output is a massive activation (‖y‖ above
    MASSIVE × the median ‖y‖: a handful of positions, up to 700× the median at the bundled
    model's block 11) are left out: squared error is theirs otherwise, and the map fitted
    through three such rows of 34,619 left a held-out FVU of 7.2 there (0.39 without them);
    a latent carries them."""
    import torch

    norms = y.norm(dim=-1)
    keep = torch.nonzero(norms <= MASSIVE * norms.median()).flatten()
    x, y = x[keep], y[keep]
    n, d_in = x.shape
    mx, my = x.double().mean(0), y.double().mean(0)
    xtx = torch.zeros(d_in, d_in, dtype=torch.float64)
    xty = torch.zeros(d_in, y.shape[1], dtype=torch.float64)
    for i in range(0, n, chunk):
        xc, yc = x[i:i + chunk].double() - mx, y[i:i + chunk].double() - my
        xtx += xc.T @ xc
        xty += xc.T @ yc
    ridge = 1e-6 * float(xtx.diagonal().mean()) + 1e-12
    W = torch.linalg.solve(xtx + ridge * torch.eye(d_in, dtype=torch.float64), xty)
    return W.float(), (my - mx @ W).float()


def evaluate(sae: TopK, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float, int]:
    """(FVU, L0, dead latents) of `sae` rebuilding y (N, d_out) from x (N, d_in) on held-out
    positions: Σ‖y − ŷ‖² / Σ‖y − mean y‖², the mean active latents, the latents that fire on
    none of them."""
    import torch

    with torch.no_grad():
        a = sae.encode(x)  # (N, n)
        err = y - sae.out(a, x)
        fvu = float((err ** 2).sum() / ((y - y.mean(0)) ** 2).sum())
        dead = int(((a != 0).sum(0) == 0).sum())
        l0 = float((a != 0).sum(-1).float().mean())
    return fvu, l0, dead


def _batch(perm: torch.Tensor, start: int, size: int) -> torch.Tensor:
    import torch

    n = perm.shape[0]
    if size >= n:
        return perm
    if start + size <= n:
        return perm[start:start + size]
    return torch.cat([perm[start:], perm[:start + size - n]])


def _step(sae: TopK, adam: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          since_fired: torch.Tensor, opts: TrainOptions) -> tuple[float, torch.Tensor]:
    """One Adam step on a batch: x (b, d_in) encoded, y (b, d_out) rebuilt (y is x for an
    SAE)."""
    import torch

    pre = sae.pre(x)  # (b, n)
    vals, idx = pre.topk(opts.k, dim=-1)
    a = torch.zeros_like(pre).scatter(-1, idx, vals)
    recon = sae.out(a, x)  # (b, d_out)
    var = ((y - y.mean(0)) ** 2).sum()
    loss = ((recon - y) ** 2).sum() / var
    dead = since_fired >= opts.dead_after
    if bool(dead.any()):  # AuxK: the dead latents rebuild what the live ones miss
        k_aux = min(int(dead.sum()), y.shape[1] // 2)
        masked = torch.where(dead[None], pre, torch.full_like(pre, -1.0))
        av, ai = masked.topk(k_aux, dim=-1)
        aux = torch.zeros_like(pre).scatter(-1, ai, av.clamp(min=0))
        residual = (y - recon).detach()
        loss = loss + ((aux @ sae.W_dec - residual) ** 2).sum() / var / 32
    adam.zero_grad()
    loss.backward()
    with torch.no_grad():  # keep only the gradient that does not change the rows' norms
        W, G = sae.W_dec, sae.W_dec.grad
        G -= (G * W).sum(-1, keepdim=True) * W
    adam.step()
    sae.normalise()
    return float(loss.detach()), idx.unique()


def check_out(out: str, resume: bool, marker: str = STATE_JSON, what: str = "training"
              ) -> None:
    """--out is a new or empty folder, or with --resume one that holds an interrupted `what`
    (its file `marker`: an SAE's state, the transcoders' manifest)."""
    if resume:
        if not os.path.isfile(os.path.join(out, marker)):
            raise BadInput(f"{param('resume')}: {out!r} holds no interrupted {what} ({marker})")
        return
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise BadInput(f"{param('out')} {out!r} exists and is not an empty folder: give a new "
                       f"folder, or "
                       f"{param('resume')} to continue the training written there")


def _save(out: str, sae: TopK, adam: torch.optim.Optimizer, since_fired: torch.Tensor,
          step: int, losses: list,
          opts: TrainOptions, source: dict) -> None:
    from safetensors.torch import save

    os.makedirs(out, exist_ok=True)
    tensors = {n: t.detach().clone().contiguous() for n, t in sae.named()}
    for i, p in enumerate(sae.params()):
        st = adam.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in st:
                tensors[f"adam.{i}.{key}"] = st[key].contiguous()
    tensors["since_fired"] = since_fired.clone()
    atomic_write(os.path.join(out, STATE), save(tensors))
    doc = {"step": step, "losses": losses, "options": opts.__dict__, **source}
    atomic_write(os.path.join(out, STATE_JSON), json.dumps(doc).encode())


def resumed_state(out: str, opts: TrainOptions, source: dict) -> dict:
    """The state of the interrupted training in `out`, refused where it was trained from other
    options, weights or prompts than this run's (`source`: train's model, weights, inputs)."""
    from fptrace.core.dictionaries import read_json

    doc = read_json(os.path.join(out, STATE_JSON))
    if doc.get("options") != opts.__dict__:
        raise BadInput(f"{param('resume')}: {out!r} was trained with other options "
                       f"({doc.get('options')}); resume with the same ones")
    check_source(out, doc, source)
    return doc


def check_source(out: str, doc: dict, source: dict) -> None:
    """What a resume must find again (`doc`: the interrupted run's record, `source`: this
    run's model, weights and prompts): the same weights (whatever the name or width), the same
    model where either has no fingerprint, the same prompts."""
    was, now = doc.get("weights"), source["weights"]
    if was is not None and now is not None and was != now:
        raise BadInput(f"{param('resume')}: {out!r} was trained on {doc.get('model')!r} with "
                       f"weights "
                       f"{was}, this run loads {source['model']!r} with weights {now}: other "
                       "weights (whatever the name or width); resume with the same model")
    if (was is None or now is None) and doc.get("model") != source["model"]:
        raise BadInput(f"{param('resume')}: {out!r} was trained on {doc.get('model')!r}, this run "
                       f"loads "
                       f"{source['model']!r}; resume with the same model")
    if doc.get("inputs") is not None and doc["inputs"] != source["inputs"]:
        raise BadInput(f"{param('resume')}: {out!r} was trained on other prompts "
                       f"({doc.get('prompts')} "
                       f"prompts, digest {doc['inputs']}; these are {source['prompts']}, digest "
                       f"{source['inputs']}); resume with the same prompt files")


def _load_state(out: str, doc: dict, sae: TopK, adam: torch.optim.Optimizer,
                since_fired: torch.Tensor) -> tuple[int, list]:
    import torch
    from safetensors.torch import load_file

    try:
        t = load_file(os.path.join(out, STATE))
    except Exception as e:
        raise BadInput(f"{param('resume')}: cannot read {os.path.join(out, STATE)!r}: "
                       f"{e}") from None
    with torch.no_grad():
        for n, p in sae.named():
            if tuple(t[n].shape) != tuple(p.shape):
                raise BadInput(f"{param('resume')}: {out!r} holds {n} of shape "
                               f"{tuple(t[n].shape)}, not "
                               f"{tuple(p.shape)}")
            p.copy_(t[n])
    step = int(doc["step"])
    if step > 0:
        for i, p in enumerate(sae.params()):
            adam.state[p] = {"step": torch.tensor(float(step)),
                             "exp_avg": t[f"adam.{i}.exp_avg"].clone(),
                             "exp_avg_sq": t[f"adam.{i}.exp_avg_sq"].clone()}
    since_fired.copy_(t["since_fired"])
    return step, list(doc.get("losses", []))


def write_saelens_folder(out: str, sae: TopK, opts: TrainOptions, lm: LoadedModel,
                   transcoder: bool = False) -> None:
    """cfg.json + sae_weights.safetensors in `out`: a TopK SAE of the stream after block L, or
    with `transcoder` a TopK transcoder of block L's MLP (architecture `topk_transcoder`, with a
    skip `topk_skip_transcoder` and W_skip stored (d_out, d_in) as SAELens's SkipTranscoder
    stores it: read by fptrace; SAELens 6 has no TopK transcoder class), named as SAELens
    names its transcoders' places: hook_name the MLP's input after its norm
    (`blocks.L.ln2.hook_normalized`), hook_name_out what the MLP adds to the stream
    (`blocks.L.hook_mlp_out`)."""
    from safetensors.torch import save

    tok = lm.tokenizer
    bos = getattr(tok, "bos_id", None) if tok is not None else None
    # what the tokenizer did to the prompts trained on (SmolLM2's GGUF adds no begin-of-text
    # token): a reader that reruns the model must prepare its prompts the same way
    prepend_bos = bool(tok is not None and bos is not None
                       and tok.encode("The", special=True)[:1] == [bos])
    L = opts.layer
    hook = f"blocks.{L}.ln2.hook_normalized" if transcoder else hook_name(Site(L, Point.resid_post))
    places = {"hook_name": hook, "hook_layer": L}
    if transcoder:
        places["hook_name_out"] = hook_name(Site(L, Point.mlp_out))
    cfg = {"architecture": "topk_transcoder" if transcoder else "topk",
           "d_in": int(sae.W_enc.shape[0]), "d_sae": opts.latents,
           **({"d_out": int(sae.W_dec.shape[1])} if transcoder else {}),
           "k": opts.k, "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": not transcoder,
           "normalize_activations": "none", "reshape_activations": "none",
           **places, "model_name": lm.name,
           "metadata": {"model_name": lm.name, **places, "prepend_bos": prepend_bos,
                        "context_size": None, "seqpos_slice": [1, None]}}
    weights = {n: t.detach().clone().contiguous() for n, t in sae.named()}
    if sae.W_skip is not None:  # SAELens's SkipTranscoder: (d_out, d_in), added as x·W_skipᵀ
        weights["W_skip"] = sae.W_skip.detach().T.contiguous()
        cfg["architecture"] = "topk_skip_transcoder"
    os.makedirs(out, exist_ok=True)
    atomic_write(os.path.join(out, "sae_weights.safetensors"), save(weights))
    atomic_write(os.path.join(out, "cfg.json"), json.dumps(cfg, indent=2).encode())

__all__ = ["TopK", "TrainOptions", "check_before_load", "check_memory", "check_options",
           "check_out", "check_source", "collect", "estimated_positions", "evaluate", "fit",
           "inputs_digest", "least_squares", "model_sizes", "split_held_out", "train",
           "training_bytes"]
