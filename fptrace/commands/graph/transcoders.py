"""`fptrace graph --transcoders DIR`: each block's MLP replaced by its transcoder, whose latents
are the graph's nodes, and the transcoder's error kept as one node per (block, position).

A folder of per-block transcoders (one dictionary folder per block, as `features train
--transcoder` writes them, any of the formats core/dictionaries.py reads), one transcoder's
own folder, or a circuit-tracer transcoder set (config.yaml and its layer files, as
`--export circuit-tracer` writes them) is read and checked against the model: every dictionary
a transcoder (an SAE is refused), reading the MLP's input and writing the MLP's output of one
block, of the model's width, no block twice. Blocks without a transcoder keep no latents:
their whole MLP output is their error node (said in the graph's notes).

In the frozen pass (freezing.py) the MLP module of block l returns, instead of its output y,

    ŷ = a · W_dec + b_dec + x · W_skip + e,    a = r ⊙ p,    p = x · W_enc + c,

x the MLP's input (the frozen norm's output), c the encoder's bias (b_enc − b_dec · W_enc when
the format subtracts b_dec from the input), r the activation function held at its value
(r = a / p: 1 for a latent that fires through ReLU, JumpReLU or TopK, 0 for the others),
x · W_skip a skip transcoder's affine term (absent without one), and e = y − (a · W_dec + b_dec
+ x · W_skip) the transcoder's error, a constant. ŷ equals y (to
float64's rounding), so every later value is the model's own; a is a leaf (a gradient stops
there: an edge is a direct effect), e is a leaf too (its edges are the error node's), c and
b_dec are bias terms. The skip term is a linear path, as attention's OV is: no node of its own,
the gradient flows through it into x, the frozen norm before the MLP and the stream, so a
source's edge to a later node counts what it writes through the skip (circuit-tracer's
replacement model does the same: its MLP output is skip + (y − skip) detached, the gradient
flowing through x · W_skipᵀ only). Only the latents that fire at some position of the prompt
are columns of a and p there (`Pass.columns`): a latent that never fires is 0 everywhere and
has no edge.

The MLP's own computation still runs (its output gives e): a mixture of experts' block is
replaced like a dense one, its router and experts held inside the error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fptrace.core.dictionaries import (
    Dictionary,
    activate,
    check_model,
    check_role,
    is_transcoder_set,
    read_dictionary,
    read_transcoder_set,
)
from fptrace.core.dictionary_sites import MLP_IN, hook_name
from fptrace.errors import BadInput, param
from fptrace.points import Point

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch import nn

    from fptrace.commands.graph.freezing import Pass, Replay
    from fptrace.models.loading import LoadedModel


@dataclass
class Transcoder:
    """One block's transcoder in float64 on the model's device."""

    block: int
    path: str
    kind: str  # relu, jumprelu, batchtopk, topk
    W_enc: torch.Tensor  # (d, n)
    c: torch.Tensor  # (n,) the encoder's bias, b_dec's shift folded in
    W_dec: torch.Tensor  # (n, d)
    b_dec: torch.Tensor  # (d,)
    threshold: torch.Tensor | None  # (n,) or None
    k: int | None
    W_skip: torch.Tensor | None = None  # (d, d) a skip transcoder's x · W_skip

    def skip(self, x: torch.Tensor) -> torch.Tensor | float:
        """x · W_skip, a skip transcoder's affine term (0.0 without one): linear in x."""
        return 0.0 if self.W_skip is None else x @ self.W_skip

    @property
    def width(self) -> int:
        return int(self.W_enc.shape[1])

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., n): the encoder's pre-activations p = x · W_enc + c."""
        return x @ self.W_enc + self.c

    def act(self, p: torch.Tensor) -> torch.Tensor:
        """The activations of pre-activations p, as the dictionary encodes, in p's dtype."""
        return activate(self.kind, p, self.threshold, self.k)


@dataclass
class TranscoderSet:
    """The transcoders of a graph: block -> Transcoder, and what was given."""

    path: str
    by_block: dict[int, Transcoder]
    n_layers: int

    @property
    def missing(self) -> tuple[int, ...]:
        return tuple(b for b in range(self.n_layers) if b not in self.by_block)

    @property
    def width(self) -> int:
        """The largest number of latents of a block (the candidates' array is this wide)."""
        return max(t.width for t in self.by_block.values())

    @property
    def skips(self) -> tuple[int, ...]:
        """The blocks whose transcoder is a skip transcoder (has W_skip)."""
        return tuple(b for b, t in sorted(self.by_block.items()) if t.W_skip is not None)

    def cast(self, dtype: torch.dtype) -> TranscoderSet:
        """The same set with its tensors in `dtype` (graph(precision="float32")'s frozen passes:
        the float32 copy of the model's)."""
        def to(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(dtype)

        return replace(self, by_block={b: replace(
            t, W_enc=t.W_enc.to(dtype), c=t.c.to(dtype), W_dec=t.W_dec.to(dtype),
            b_dec=t.b_dec.to(dtype), threshold=to(t.threshold), W_skip=to(t.W_skip))
            for b, t in self.by_block.items()})


def _folders(path: str) -> list[str]:
    """The dictionary folders under `path`: itself when it is one, else its subfolders that are
    (sorted by name)."""
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        raise BadInput(f"{param('transcoders')} {path!r}: cannot read the folder "
                       f"({e.strerror or e})") from None
    marks = ("cfg.json", "params.npz", "params.safetensors")
    if any(n in names for n in marks):
        return [path]
    subs = [os.path.join(path, n) for n in names
            if os.path.isdir(os.path.join(path, n))
            and any(os.path.exists(os.path.join(path, n, m)) for m in marks)]
    if not subs:
        raise BadInput(f"{param('transcoders')} {path!r}: no transcoder there: give a folder of "
                       f"per-block "
                       "transcoder folders (each with cfg.json, as `fptrace features train "
                       f"{param('transcoder')}` writes them), one transcoder's folder or a "
                       "circuit-tracer transcoder set (its config.yaml)")
    return subs


def read_transcoders(path: str, lm: LoadedModel) -> TranscoderSet:
    """The transcoders in `path`, checked against the model (see the module's text), in float64
    on the model's device."""
    from fptrace.core.trace import model_info

    if lm.parts.family.mlp_added:
        raise BadInput(f"graph {param('transcoders')}: the {lm.parts.family.title} family "
                       f"normalises "
                       "the MLP's output before the stream receives it; a transcoder of the "
                       "MLP's output is not yet placed there")
    info = model_info(lm)
    by_block: dict[int, Transcoder] = {}
    device = lm.parts.embed.weight.device
    dicts = read_transcoder_set(path) if is_transcoder_set(path) else \
        (read_dictionary(folder, what="--transcoders") for folder in _folders(path))
    for d in dicts:
        folder = d.path
        check_role(d, "transcoder", "--transcoders")
        check_model(d, info.n_layers, info.d_model, lm.name, "--transcoders")
        if d.site.point is not MLP_IN or d.out_site.point is not Point.mlp_out or \
                d.site.layer != d.out_site.layer:
            raise BadInput(f"{param('transcoders')} {folder!r} maps {hook_name(d.site)} to "
                           f"{hook_name(d.out_site)}; a graph's transcoder maps one block's MLP "
                           "input to its output")
        if d.d_in != info.d_model:
            raise BadInput(f"{param('transcoders')} {folder!r} reads vectors of width {d.d_in}; "
                           f"{lm.name}'s MLP input has width {info.d_model}: a transcoder of "
                           "another model")
        if d.site.layer in by_block:
            raise BadInput(f"{param('transcoders')} {path!r}: two transcoders for block "
                           f"{d.site.layer} "
                           f"({by_block[d.site.layer].path!r} and {folder!r})")
        by_block[d.site.layer] = _float64(d, device)
    return TranscoderSet(path=path, by_block=by_block, n_layers=info.n_layers)


def replacement_hook(state: Pass, layer: int, tc: Transcoder | None) -> Callable[..., object]:
    """The forward hook of block `layer`'s MLP module in the frozen pass: its output replaced
    by the transcoder's reconstruction plus its error (see the module's text); without a
    transcoder, by the error alone. Fills state.acts, state.leaves, state.errors and the bias
    terms."""
    import torch

    def hook(module: nn.Module, args: tuple, output: torch.Tensor | tuple) -> object:
        y = output[0] if isinstance(output, tuple) else output
        if state.replay is not None:  # freezing.Replay: row 0's gates and error
            new = _replayed(state, state.replay, layer, tc, args[0], y)
        elif tc is None:
            new = y.detach().clone().requires_grad_(True)  # all of it error
            state.errors[layer] = new
        else:
            x = args[0]
            with torch.no_grad():  # which latents fire where (a firing latent passes p)
                fires = tc.act(tc.pre(x)) != 0  # (B, T, n)
            # the columns kept: the latents that fire somewhere (the others are 0 everywhere,
            # without an edge out: leaving them out saves most of the backward passes' work)
            kept = fires.flatten(0, -2).any(0).nonzero().flatten()  # (U,) sorted
            state.columns[layer] = kept
            c = tc.c[kept]
            p = x @ tc.W_enc[:, kept] + c  # (B, T, U)
            state.biases.append((c, p))
            r = fires[..., kept].to(p.dtype)  # 1 where it fires, else 0
            a = r * p.detach()
            state.acts[layer] = r * p  # linear in x
            leaf = a.detach().requires_grad_(True)  # a gradient stops here: edges are direct
            state.leaves[layer] = leaf
            recon = leaf @ tc.W_dec[kept] + tc.b_dec  # (B, T, d)
            if tc.W_skip is not None:  # the skip term: a linear path through x, no leaf
                skip = tc.skip(x)
                state.skips[layer] = skip
                recon = recon + skip
            err = (y.detach() - recon.detach()).requires_grad_(True)
            state.errors[layer] = err
            new = recon + err
            state.biases.append((tc.b_dec, new))
        return (new, *output[1:]) if isinstance(output, tuple) else new
    return hook


def _replayed(state: Pass, replay: Replay, layer: int, tc: Transcoder | None, x: torch.Tensor,
              y: torch.Tensor) -> torch.Tensor:
    """A replay's MLP output (freezing.Replay): the reconstruction of each row's latents (row
    0's held, or following the input with row 0's gates; the removed one 0) plus row 0's
    error; without a transcoder, row 0's output (all of it error)."""
    import torch

    if tc is None:
        return y[:1].expand_as(y)
    p = tc.pre(x)  # (B, T, n)
    p0 = p[:1]
    a0 = tc.act(p0)
    r = torch.where(p0 != 0, a0 / torch.where(p0 != 0, p0, 1.0), 0.0)
    state.acts[layer] = r * p
    base = a0.expand_as(p).clone() if replay.hold else r * p
    error = y[:1] - (a0 @ tc.W_dec + tc.b_dec + tc.skip(x[:1]))  # (1, T, d)
    # the skip term follows each row's input (a linear path, held by nothing)
    return replay.remove(base, layer) @ tc.W_dec + tc.b_dec + tc.skip(x) + error


def latents_hook(acts: dict, layer: int, tc: Transcoder) -> Callable[..., None]:
    """The forward hook of block `layer`'s MLP module in the real pass: the transcoder's
    activations of the MLP's input (T, n), float64."""
    def hook(module: nn.Module, args: tuple, output: object) -> None:
        acts[layer] = tc.act(tc.pre(args[0][0].detach())).cpu()
    return hook


def _float64(d: Dictionary, device: torch.device) -> Transcoder:
    import torch

    def f64(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device=device, dtype=torch.float64)

    W_enc, b_enc, b_dec = f64(d.W_enc), f64(d.b_enc), f64(d.b_dec)
    c = b_enc - b_dec @ W_enc if d.shift_input else b_enc
    return Transcoder(block=d.site.layer, path=d.path, kind=d.kind, W_enc=W_enc, c=c,
                      W_dec=f64(d.W_dec), b_dec=b_dec,
                      threshold=None if d.threshold is None else f64(d.threshold), k=d.k,
                      W_skip=None if d.W_skip is None else f64(d.W_skip))


__all__ = ["Transcoder", "TranscoderSet", "latents_hook", "read_transcoders", "replacement_hook"]
