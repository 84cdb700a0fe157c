"""The model made linear: what `fptrace graph --neurons` holds fixed, and the hooks that hold it.

In one forward pass of the prompt (a float64 copy of the model), each nonlinear step is replaced
by the linear map it is at its actual input, so the values are the model's own while the
gradients are those of a linear model:

- every norm (RMSNorm, LayerNorm; the attention and MLP post-norms, the Q/K norms, the final
  norm): x ↦ (x − mean x if LayerNorm) · g + β, with g = γ / √(var x + ε) frozen (core/
  attribution.py's frozen_norm);
- attention: the pattern softmax(q·kᵀ) frozen (q and k detached), so a head's output is the
  frozen pattern times its values: linear in the stream; with gpt-oss's sinks (a learned logit
  per head that joins each row's softmax and is then dropped) the pattern is computed as the
  model computes it, the sink's column dropped, so its rows sum to less than 1, and held the
  same way; the mask given (sliding-window or full, per layer) is used as it is;
- the MLP: a neuron's activation a = r · u, u its up-projection pre-activation, r frozen at
  a / u (SwiGLU and GeGLU: r = act(gate); a GELU MLP: r = gelu(u) / u), so a is linear in u;
  and the activation entering the down projection is a leaf, so that a gradient stops there:
  an edge is a direct effect (it passes through no other neuron).

Where each part lives comes from the family file: the points `mlp_up` (u) and `mlp_act` (a, the
down projection's input) of its taps. A family without them (a model type without a family
file) is refused before anything runs. A mixture of experts' block is frozen by experts.py:
the router's choice and weights held, each chosen expert's neurons a = r · u with r frozen and
a leaf, its output recomputed from the experts' weights (checked equal to the module's own).

A replay (`frozen(..., replay=Replay(...))`, `graph --verify`: verify.py) runs a batch whose
row 0 is the prompt and each other row the prompt with one node removed, every row frozen at row
0's values: its patterns, norm scales and gates; with `hold`, every other node's activation too.
Nothing there is a gradient: it is the intervention the edges predict.

The logits are the LM head's output (before any final softcap). What is constant under the
freezing (every bias of a linear map or a norm, a learned position embedding) is a bias term:
its contribution to a node is the bias times the gradient of the module's output.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from fptrace.commands.graph.experts import (
    CLAMPED_FREEZING,
    MOE_FREEZING,
    ExpertLayout,
    MoeSites,
    frozen_hook,
    layouts,
    moe_sites,
    router_hook,
)
from fptrace.commands.graph.transcoders import TranscoderSet, replacement_hook
from fptrace.core.attribution import frozen_norm
from fptrace.core.hooks import Hook, first_output, hooked
from fptrace.errors import BadInput, param
from fptrace.families.kinds import MlpKind
from fptrace.points import Point

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fptrace.families import Family
    from fptrace.families.kinds import NormKind
    from fptrace.families.parts import ModelParts

ATTENTION = "fptrace-frozen-pattern"  # the attention implementation registered for the pass

# what is held fixed, printed with every graph (render.py) and carried in its JSON
FREEZING = (
    "attention patterns: softmax(q·kᵀ) at its value in this forward pass (q and k held)",
    "every norm's scale (RMSNorm/LayerNorm: γ / √(var + ε)) at its value for each position",
    "each neuron's gate: activation = r · u with r held at its value (SwiGLU/GeGLU: "
    "r = act(gate); GELU: r = gelu(u)/u), so it is linear in its up pre-activation u",
    "the logit: the LM head's output, before any final softcap",
)
EDGE_MEANING = ("an edge is the direct effect of a source (its value × the gradient of the "
                "target under this freezing, through no other neuron) on a neuron's activation "
                "or a logit")
# --transcoders: the MLPs replaced (transcoders.py)
TRANSCODER_FREEZING = (
    FREEZING[0], FREEZING[1],
    "each block's MLP replaced by its transcoder's reconstruction plus its error: the error "
    "(what the transcoder misses at each position) held as a constant, its own node",
    "each latent's activation function held at its value (a firing latent passes its "
    "pre-activation, the others 0), so a latent is linear in the MLP's input",
    FREEZING[3],
)
# gpt-oss (its family's attn_sinks), after the patterns' line
SINK_FREEZING = ("attention sinks (gpt-oss): each head's learned sink logit joins every row's "
                 "softmax and its column is then dropped, as the model computes it, so a row "
                 "sums to 1 − the sink's share; that pattern is the one held (the mask as the "
                 "model gives it: sliding-window or full)")
# said besides, where a transcoder of the set has a skip (an affine term x·W_skip)
SKIP_FREEZING = ("a skip transcoder's skip term x·W_skip is a linear path, held by nothing: no "
                 "node of its own, the gradient flows through it into the MLP's input (the "
                 "frozen norm, the stream), as through attention's OV")
TRANSCODER_EDGE = ("an edge is the direct effect of a source (its value × the gradient of the "
                   "target under this freezing, through no other latent) on a latent's "
                   "activation or a logit")


def freezing_lines(family: Family, transcoders: bool,
                   experts: dict[int, ExpertLayout], blocks: int,
                   skip: bool = False) -> tuple[str, ...]:
    """What a graph holds fixed, printed with it: FREEZING (TRANSCODER_FREEZING with
    `transcoders`, and SKIP_FREEZING where one of them has a skip: `skip`); with MoE blocks
    (`experts`, of `blocks`), the router's and the experts' lines (gpt-oss's clamped experts:
    CLAMPED_FREEZING), the dense gate's line only where a block is dense; SINK_FREEZING where
    the family's attention has sinks."""
    lines = TRANSCODER_FREEZING if transcoders else FREEZING
    if transcoders and skip:
        lines = (*lines[:3], SKIP_FREEZING, *lines[3:])
    if experts:
        clamped = any(lay.limit is not None for lay in experts.values())
        dense = FREEZING[2:3] if len(experts) < blocks else ()
        lines = (*FREEZING[:2], *dense, MOE_FREEZING[0],
                 CLAMPED_FREEZING if clamped else MOE_FREEZING[1], FREEZING[3])
    if family.attn_sinks:
        lines = (lines[0], SINK_FREEZING, *lines[1:])
    return lines


@dataclass(frozen=True)
class MlpSites:
    """Where one family's MLP shows the two values a neuron is made of: the up pre-activation
    u (a module's output, or one slice of a fused projection) and the activation a (the down
    projection's input)."""

    up: str  # block-relative path of the module whose output holds u
    up_part: tuple[int, int] | None  # (i, n): u is the i-th of n slices of that output
    down: str  # block-relative path of the down projection (its input is a)
    # a mixture of experts: its blocks' parts (experts.py); up and down are then its dense
    # blocks' (DeepSeek-V3's first), None for a dense family
    moe: MoeSites | None = None


def mlp_sites(family: Family) -> MlpSites:
    """The family's MLP sites, or BadInput saying why its MLP cannot be frozen."""
    up = family.taps.get(Point.mlp_up)
    act = family.taps.get(Point.mlp_act)
    if family.mlp_type is MlpKind.moe:
        moe = moe_sites(family)
        return MlpSites(up=f"{family.mlp}.{moe.dense[1]}", up_part=None,
                        down=f"{family.mlp}.{moe.dense[2]}", moe=moe)
    if family.name.startswith("generic:"):
        raise BadInput(f"graph {param('neurons')}: fptrace has no family file for model type "
                       f"{family.title!r}, so it cannot tell where its MLP's neurons are to "
                       "freeze them")
    if family.mlp_type is MlpKind.unknown or up is None or act is None or act.side != "in" \
            or up.side != "out":
        raise BadInput(f"graph {param('neurons')}: fptrace cannot freeze the MLP of the "
                       f"{family.title} "
                       "family (its file does not show the up pre-activation and the "
                       "activation)")
    return MlpSites(up=up.module, up_part=up.part, down=act.module)


@dataclass(frozen=True)
class Replay:
    """A replay's rows (module text): removed[b] the node row b removes, (layer, position,
    index), None for row 0 (the prompt as it is); hold: every other node's activation held at
    row 0's (the edges' direct effects), else following its input linearly (its gate held)."""

    removed: tuple[tuple[int, int, int] | None, ...]
    hold: bool

    def remove(self, base: torch.Tensor, layer: int) -> torch.Tensor:
        """base (B, T, m), the activations entering block `layer`'s down projection (its
        transcoder's decoder), with each row's removed node of that block set to 0."""
        for b, node in enumerate(self.removed):
            if node is not None and node[0] == layer:
                base[b, node[1], node[2]] = 0.0
        return base


# set while a replay runs: the attention function then reads row 0's q and k for every row
_REPLAYING: contextvars.ContextVar[bool] = contextvars.ContextVar("replaying", default=False)
# set while a frozen pass runs: its Pass and each attention module's block (id(module) -> layer),
# where the attention function leaves the values and outputs of the heads
# and whether the heads' outputs and patterns are kept too
_KEEPING: contextvars.ContextVar[tuple[Pass, dict[int, int], bool] | None] = \
    contextvars.ContextVar("keeping", default=None)


def _row0(t: torch.Tensor) -> torch.Tensor:
    """Row 0 of a batch, standing for every row."""
    return t[:1].expand_as(t)


@dataclass
class Pass:
    """What one frozen forward pass left behind (tensors of the float64 copy, batch B)."""

    embed: Any = None  # (B, T, d) the token embeddings, a leaf
    # (B, T, d) a learned position embedding's output, a leaf, or None
    pos: torch.Tensor | None = None
    u: dict = field(default_factory=dict)  # layer -> (B, T, m) the up pre-activation
    # MoE block -> the router's (indices (B·T, k), weights (B·T, k)), read by its MLP's hook
    routes: dict = field(default_factory=dict)
    acts: dict = field(default_factory=dict)  # layer -> (B, T, m) a = r·u, linear in u
    leaves: dict = field(default_factory=dict)  # layer -> (B, T, m) a, a leaf
    # layer -> (U,) the latents that are the columns of acts and leaves there (transcoders:
    # those that fire somewhere, in order); a layer absent: every neuron, in order
    columns: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)  # layer -> (B, T, d) a transcoder's error, a leaf
    # layer -> (B, T, d) a skip transcoder's skip term x·W_skip (a linear path; heads.py splits
    # what passes through it)
    skips: dict = field(default_factory=dict)
    biases: list = field(default_factory=list)  # (bias (n,), the module's output (..., n))
    logits: Any = None  # (B, Q, V) the LM head's output at the query positions
    replay: Replay | None = None  # a replay's rows (verify.py), or None for the frozen pass
    # what the split of an edge over attention heads reads (heads.py), per block: the stream
    # entering it (B, T, d), the stream its MLP reads (B, T, d; resid_mid, or the block's input
    # with a parallel residual), what the stream receives from its MLP (B, T, d), the values
    # each query head's frozen pattern multiplies (B, nh, T, hd; grouped-query: each K/V head's
    # repeated for its query heads); with --qk, each head's output pattern @ v (B, nh, T, hd)
    # and what its pattern is made of (q, k, mask, scale, softcap, sinks: frozen_pattern)
    blocks_in: dict = field(default_factory=dict)
    reads: dict = field(default_factory=dict)
    mlp_out: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)
    heads_out: dict = field(default_factory=dict)
    patterns: dict = field(default_factory=dict)
    final_in: torch.Tensor | None = None  # (B, T, d) the stream entering the final norm


# the frozen patterns the pass may hold for its backward passes (every block's, B × heads × T²
# values); past it, each block's pattern is recomputed from its held q and k in every backward
# pass instead (the same operations on the same values: the same pattern, bit for bit), so
# that the pass's memory stays linear in the prompt's length at the cost of that recomputation
HELD_PATTERNS_BYTES = 1 << 30


def holds_patterns(batch: int, heads: int, queries: int, keys: int, itemsize: int,
                   blocks: int) -> bool:
    """Whether a frozen pass holds every block's pattern (batch × heads × queries × keys values
    of `itemsize` bytes a block) for its backward passes: while they take at most
    HELD_PATTERNS_BYTES; past it, the pass holds q and k and recomputes each pattern."""
    return batch * heads * queries * keys * itemsize * blocks <= HELD_PATTERNS_BYTES


def _frozen_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      scaling: float | None = None, dropout: float = 0.0,
                      softcap: float | None = None, **kwargs: object
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The AttentionInterface function of the frozen pass: eager attention with q and k
    detached, so the pattern is a constant and the output is linear in the values."""
    sinks = cast("torch.Tensor | None", kwargs.get("s_aux", kwargs.get("sinks")))  # gpt-oss:
    sinks = None if sinks is None else sinks.detach()  # (nh,) a learned logit per head
    q, k = query.detach(), key.detach()  # (B, nh, T, hd), (B, nkv, T, hd)
    if _REPLAYING.get():  # every row attends as the prompt does
        q, k = _row0(q), _row0(k)
    v = value.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, nh, T, hd)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    blocks = getattr(getattr(module, "config", None), "num_hidden_layers", 1)
    if holds_patterns(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.element_size(), blocks):
        pattern = frozen_pattern(q, k, attention_mask, scale, softcap, sinks)  # a constant
        out = pattern @ v  # (B, nh, T, hd)
    else:
        pattern = None
        out = _recomputed_pattern().apply(v, q, k, attention_mask, scale, softcap, sinks)
    _keep_heads(module, v, out, (q, k, attention_mask, scale, softcap, sinks))
    return out.transpose(1, 2).contiguous(), pattern  # (B, T, nh, hd)


def _keep_heads(module: nn.Module, v: torch.Tensor, out: torch.Tensor, pattern: tuple) -> None:
    """In a frozen pass (not a replay), the block's values (and, where asked, its heads'
    outputs and what its pattern is made of), for the split of the edges over heads
    (heads.py)."""
    keeping = _KEEPING.get()
    if keeping is None:
        return
    state, layers, outputs = keeping
    layer = layers.get(id(module), getattr(module, "layer_idx", None))
    if layer is not None:
        state.values[layer] = v
        if outputs:
            state.heads_out[layer], state.patterns[layer] = out, pattern


def frozen_pattern(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float,
                   softcap: float | None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q·kᵀ · scale (softcapped) + mask): (B, nh, T, T) from q (B, nh, T, hd) and k
    (B, nkv, T, hd) (grouped-query: each K head repeated for its query heads). With sinks (nh,)
    (gpt-oss), as transformers' gpt-oss attention computes it: each head's sink logit a last
    column of every row, the row's maximum subtracted, the softmax taken, the sink's column
    dropped (each row then sums to 1 − the sink's share)."""
    import torch

    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, nh, T, hd)
    scores = q @ k.transpose(2, 3) * scale  # (B, nh, T, T)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask[:, :, :, : k.shape[-2]]
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    B, nh, T, _ = scores.shape
    sink = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(B, nh, T, 1)  # (B, nh, T, 1)
    both = torch.cat([scores, sink], dim=-1)  # (B, nh, T, T + 1)
    both = both - both.max(dim=-1, keepdim=True).values
    return torch.softmax(both, dim=-1)[..., :-1]  # (B, nh, T, T), the sink's column dropped


@functools.cache
def _recomputed_pattern() -> type[torch.autograd.Function]:
    """pattern @ v as an autograd function that holds q and k (linear in T) instead of the
    pattern (T²), and recomputes the pattern in each backward pass."""
    import torch

    class RecomputedPattern(torch.autograd.Function):
        generate_vmap_rule = True  # the backward passes are batched (is_grads_batched)

        @staticmethod
        def forward(v: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                    mask: torch.Tensor | None, scale: float,
                    softcap: float | None, sinks: torch.Tensor | None) -> torch.Tensor:
            return frozen_pattern(q, k, mask, scale, softcap, sinks) @ v

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
            _, q, k, mask, scale, softcap, sinks = inputs
            ctx.save_for_backward(q, k, mask, sinks)
            ctx.scale, ctx.softcap = scale, softcap

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple:
            q, k, mask, sinks = ctx.saved_tensors
            pattern = frozen_pattern(q, k, mask, ctx.scale, ctx.softcap, sinks)
            return pattern.transpose(-1, -2) @ grad, None, None, None, None, None, None

    return RecomputedPattern


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTENTION, _frozen_attention)
    AttentionMaskInterface.register(ATTENTION, eager_mask)


def is_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    return name.endswith("Norm") and ("RMS" in name or "LayerNorm" in name)


def _norm_hook(norm_type: NormKind, state: Pass) -> Callable[..., torch.Tensor]:
    def hook(module: nn.Module, args: tuple, output: object) -> torch.Tensor:
        x = args[0]
        held = x.detach() if state.replay is None else x.detach()[:1]  # a replay: row 0's
        centre, gain, bias = frozen_norm(module, held, norm_type)
        y = (x - x.mean(dim=-1, keepdim=True)) if centre else x
        y = y * gain.to(x.dtype)  # (B, T, d): linear in x
        if bias is not None:
            b = bias.to(x.dtype)
            y = y + b
            state.biases.append((b, y))
        return y
    return hook


def _bias_hook(state: Pass) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple, output: object) -> None:
        out = first_output(output)
        if out.requires_grad:
            state.biases.append((module.bias, out))
    return hook


def _leaf_hook(state: Pass, key: str) -> Callable[..., torch.Tensor]:
    def hook(module: nn.Module, args: tuple, output: object) -> torch.Tensor:
        leaf = first_output(output).detach().requires_grad_(True)
        setattr(state, key, leaf)
        return leaf
    return hook


def _up_hook(state: Pass, layer: int, part: tuple[int, int] | None) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple, output: object) -> None:
        u = first_output(output)
        if part is not None:
            i, n = part
            u = u.chunk(n, dim=-1)[i]
        state.u[layer] = u
    return hook


def _down_hook(state: Pass, layer: int) -> Callable[..., tuple]:
    def hook(module: nn.Module, args: tuple) -> tuple:
        import torch

        a, u = args[0], state.u[layer]
        if state.replay is not None:  # row 0's gates; the activations held or following u
            a0, u0 = a[:1], u[:1]
            r = torch.where(u0 != 0, a0 / torch.where(u0 != 0, u0, 1.0), 0.0)
            state.acts[layer] = r * u
            base = _row0(a).clone() if state.replay.hold else r * u
            return (state.replay.remove(base, layer), *args[1:])
        r = torch.where(u != 0, a / torch.where(u != 0, u, 1.0), 0.0).detach()  # frozen gate
        state.acts[layer] = r * u  # (B, T, m): linear in u
        leaf = a.detach().requires_grad_(True)  # a gradient stops here: edges are direct
        state.leaves[layer] = leaf
        return (leaf, *args[1:])
    return hook


def _keep_in(store: dict, key: int) -> Callable[..., None]:
    """A pre-hook (with kwargs) that keeps the module's first input (hidden_states) at key."""
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        store[key] = args[0] if args else kwargs["hidden_states"]
    return hook


def _keep_out(store: dict, key: int) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple, output: object) -> None:
        store[key] = first_output(output)
    return hook


def _keep_logits(state: Pass) -> Callable[..., None]:
    def hook(module: nn.Module, args: tuple, output: object) -> None:
        state.logits = first_output(output)
    return hook


def float64_norms(model: nn.Module, parts: ModelParts, state: Pass | None = None) -> list[Hook]:
    """Hooks that compute every norm of `model` in float64 as the linear map it is at its
    input (frozen_norm): the real pass (with no gradient) and the frozen pass use them."""
    state = Pass() if state is None else state
    return [Hook.after(m, _norm_hook(parts.family.norm_type, state)) for m in model.modules()
            if is_norm(m)]


def _head_hooks(parts: ModelParts, state: Pass) -> list[Hook]:
    """Hooks keeping each block's input, the stream its MLP reads (the family's resid_mid
    point), what the stream receives from its MLP, and the final norm's input."""
    read = parts.family.taps[Point.resid_mid]

    def final(module: nn.Module, args: tuple, kwargs: dict) -> None:
        state.final_in = args[0] if args else kwargs["hidden_states"]

    hooks = [Hook.before(parts.final_norm, final, kwargs=True)]
    for layer, blk in enumerate(parts.blocks):
        hooks.append(Hook.before(blk, _keep_in(state.blocks_in, layer), kwargs=True))
        module = blk.get_submodule(read.module)
        hooks.append(Hook.before(module, _keep_in(state.reads, layer), kwargs=True)
                     if read.side == "in" else Hook.after(module, _keep_out(state.reads, layer)))
        hooks.append(Hook.after(parts.mlp_adds[layer], _keep_out(state.mlp_out, layer)))
    return hooks


@contextlib.contextmanager
def frozen(model: Any, parts: ModelParts, sites: MlpSites | None,
           transcoders: TranscoderSet | None = None, replay: Replay | None = None,
           outputs: bool = False) -> Iterator[Pass]:
    """Inside: a forward of `model` (the float64 copy, its ModelParts `parts`) runs frozen
    (see the module's text) and fills the Pass yielded; with `transcoders` (a TranscoderSet),
    each block's MLP is replaced by its transcoder instead (transcoders.py) and `sites` is not
    read; with `replay`, the batch's rows are its rows (Replay); with `outputs`, each head's
    output and what its pattern is made of are kept too (graph --qk: heads.by_query)."""
    state = Pass(replay=replay)
    fam = parts.family
    hooks = [Hook.after(parts.embed, _leaf_hook(state, "embed"))]
    experts = layouts(parts, None if sites is None or transcoders is not None else sites.moe)
    if fam.pos_embed:
        hooks.append(Hook.after(model.get_submodule(fam.pos_embed), _leaf_hook(state, "pos")))
    for layer, blk in enumerate(parts.blocks):
        if transcoders is not None:
            hooks.append(Hook.after(parts.mlps[layer], replacement_hook(
                state, layer, transcoders.by_block.get(layer))))
            continue
        assert sites is not None
        if layer in experts:
            assert sites.moe is not None
            mlp = parts.mlps[layer]
            hooks += [Hook.after(mlp.get_submodule(sites.moe.router),
                                 router_hook(state.routes, layer)),
                      Hook.after(mlp, frozen_hook(state, layer, sites.moe, experts[layer]))]
            continue
        hooks.append(Hook.after(blk.get_submodule(sites.up), _up_hook(state, layer,
                                                                       sites.up_part)))
        hooks.append(Hook.before(blk.get_submodule(sites.down), _down_hook(state, layer)))
    hooks += float64_norms(model, parts, state)
    for m in model.modules():
        if not is_norm(m) and getattr(m, "bias", None) is not None and hasattr(m.bias, "dim") \
                and m.bias.dim() == 1 and m is not parts.embed:
            hooks.append(Hook.after(m, _bias_hook(state)))
    hooks.append(Hook.after(parts.lm_head, _keep_logits(state)))
    if replay is None:  # what the split of the edges over heads reads (heads.py); first, so
        hooks = _head_hooks(parts, state) + hooks  # that they run after the others (prepend)
    _register_attention()
    before = getattr(model.config, "_attn_implementation", None)
    model.set_attn_implementation(ATTENTION)
    token = _REPLAYING.set(replay is not None)
    keeping = _KEEPING.set(None if replay is not None else
                           (state, {id(a): l for l, a in enumerate(parts.attns)}, outputs))
    try:
        with hooked(hooks, prepend=True):
            yield state
    finally:
        _KEEPING.reset(keeping)
        _REPLAYING.reset(token)
        if before is not None:
            model.set_attn_implementation(before)


__all__ = ["ATTENTION", "EDGE_MEANING", "FREEZING", "SINK_FREEZING", "SKIP_FREEZING",
           "TRANSCODER_EDGE", "TRANSCODER_FREEZING", "MlpSites", "Pass", "Replay",
           "float64_norms", "freezing_lines", "frozen", "holds_patterns", "mlp_sites"]
