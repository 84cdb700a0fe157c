"""`fptrace graph --neurons` on a mixture of experts: each chosen expert's neurons as nodes.

In an MoE block the router chooses k experts at each position, with weights; each chosen
expert is a SwiGLU MLP stored in the experts module's 3-D tensors (gate_up_proj (E, 2·I, d),
down_proj (E, d, I); gpt-oss's transposed, gate and up interleaved, with biases: the family
ops' expert_gate_up and expert_down read either); shared experts (Qwen2-MoE's, gated by
σ(shared_expert_gate · x); DeepSeek-V3's) are a SwiGLU MLP that every position takes. In the
frozen pass (freezing.py) the MLP module's output is replaced by the same computation, written
out so that its neurons show:

    y = Σ_{e chosen at t} w_{t,e} · W_down[e] · a_e + g_t · W_down_s · a_s,
    a_e = r_e ⊙ u_e,   u_e = the up half of gate_up_proj[e] · x,   r_e = act(gate half)

with the router's choice and its weights w held at their values (the model's own router output,
read by a hook on the router), each neuron's gate r frozen (SwiGLU: r = act(gate)), the shared
gate g = σ(shared_expert_gate · x) frozen, and the activations a a leaf (a gradient stops there:
an edge is a direct effect). The recomputed y must equal the module's own output (Mismatch,
exit 5, otherwise); every later value is then the model's own.

gpt-oss's experts compute a = (clamp(u, ±limit) + 1) · r, r = g_c · σ(α · g_c), g_c = min(gate,
limit), and add a bias to gate, up and down. Frozen (LinearForm): r held, and whether u is
clamped held, a = r · m · u + K with m = 1 where u is within ±limit (a follows u) and 0 where it
is clamped, K = r (the +1) plus r · (±limit) where clamped. A clamped neuron's activation is
then the constant r · (±limit + 1), like a bias: it is no node (model64.Real.clamped keeps it
out of the candidates), and what it writes is a bias term of every node it reaches. K, the up
bias's r · m · b_up, the clamped neurons' values and the down biases' Σ_e w_e · b_down[e] are
constants: bias terms (freezing.Pass.biases), so every node's edges plus its bias terms are
still its value.

The neurons of block l are numbered as one MLP of n_experts · d_expert + d_shared neurons
(ExpertLayout): expert e's neuron n is e · d_expert + n, the shared experts' neuron n is
n_experts · d_expert + n. At a position, only the chosen experts' neurons are computed; every
other expert's are 0 there (no node, no edge).

A dense block of a partly-MoE model (DeepSeek-V3's first blocks) is frozen as a dense MLP
(freezing.py's hooks on its up and down projections).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from fptrace.commands.graph.result import GraphRoute
from fptrace.core.hooks import Hook, first_output
from fptrace.errors import BadInput, Mismatch, param

if TYPE_CHECKING:
    from torch import Tensor, nn

    from fptrace.families import Family
    from fptrace.families.parts import ModelParts

HookFn = Callable[..., object]


class HeldRows(Protocol):
    """A replay's rows (freezing.Replay): whether the other nodes are held, and the removal."""

    @property
    def hold(self) -> bool: ...

    def remove(self, base: Tensor, layer: int) -> Tensor: ...


class FrozenState(Protocol):
    """What the frozen pass's MoE hook fills (freezing.Pass)."""

    @property
    def routes(self) -> dict: ...

    @property
    def columns(self) -> dict: ...

    @property
    def acts(self) -> dict: ...

    @property
    def leaves(self) -> dict: ...

    @property
    def replay(self) -> HeldRows | None: ...

    @property
    def biases(self) -> list: ...

MODULE_RTOL = 1e-9  # |recomputed block output − the module's own| ≤ this · max |own| (float64)
# ... in graph(precision="float32")'s float32 passes (the same sums in another order, float32's
# rounding: 3e-8 measured on the tiny Mixtral; each row is checked against its float64 value)
MODULE_RTOL_FLOAT32 = 1e-5


@dataclass(frozen=True)
class MoeSites:
    """Where an MoE block's parts are, from its MLP module (the family file): the router (its
    output (logits, weights of the chosen, indices of the chosen)), the routed experts (3-D
    tensors), the shared experts and their gate (or None), and the gate, up and down
    projections of a dense SwiGLU MLP of the family (its shared experts', its dense blocks')."""

    router: str
    experts: str
    shared: str | None
    shared_gate: str | None
    dense: tuple[str, str, str]


@dataclass(frozen=True)
class ExpertLayout:
    """How one MoE block's neurons are numbered (see the module's text)."""

    n_experts: int
    d_expert: int
    d_shared: int  # 0: no shared experts
    # gpt-oss's clamp: u within ±limit, the gate capped at limit (its experts' `limit`); None:
    # plain SwiGLU experts
    limit: float | None = None
    biased: bool = False  # the experts add a bias to gate, up and down (gpt-oss's)

    @property
    def width(self) -> int:
        return self.n_experts * self.d_expert + self.d_shared

    def split(self, index: int) -> tuple[int | None, int]:
        """(the routed expert, or None for the shared experts; the neuron within it)."""
        e, n = divmod(index, self.d_expert)
        if e < self.n_experts:
            return e, n
        return None, index - self.n_experts * self.d_expert

    def name(self, index: int) -> str:
        """`E5 N417` (routed expert 5's neuron 417) or `shared N3`."""
        e, n = self.split(index)
        return f"shared N{n}" if e is None else f"E{e} N{n}"


# what the freezing holds in an MoE block, printed with the graph beside freezing.FREEZING
MOE_FREEZING = (
    "a mixture of experts' router: at each position the experts it chose and their weights held "
    "at their values (an expert not chosen there is not computed there: its neurons are 0, no "
    "node)",
    "each chosen expert's neurons as a dense MLP's: a = r · u, r = act(gate) held; a shared "
    "expert's gate σ(shared_expert_gate · x) held",
)
# gpt-oss's experts (ExpertLayout.limit), in place of MOE_FREEZING's second line
CLAMPED_FREEZING = (
    "each chosen expert's neurons (gpt-oss's clamped SwiGLU, a = (clamp(u, ±limit) + 1) · r): "
    "r = g·σ(α·g), g = min(gate, limit), held, and whether u is clamped held: a = r · u + r "
    "where u is within ±limit, linear in u (r and the up bias's r · b bias terms); a "
    "clamped neuron's a = r · (±limit + 1) is a constant: no node, what it writes a bias "
    "term; the experts' down biases, × their routing weights, bias terms"
)


def neuron_name(experts: dict[int, ExpertLayout], layer: int, index: int) -> str:
    """`E5 N417`, `shared N3` in an MoE block, `N417` in a dense one."""
    lay = experts.get(layer)
    return f"N{index}" if lay is None else lay.name(index)


def neuron_fields(experts: dict[int, ExpertLayout], layer: int,
                  index: int) -> tuple[int | None, bool, int | None]:
    """GraphNode's expert, shared_expert and neuron of neuron `index` of block `layer` (None,
    False, None for a dense block's)."""
    lay = experts.get(layer)
    if lay is None:
        return None, False, None
    e, n = lay.split(index)
    return e, e is None, n


def graph_routes(routes: dict, sites: set[tuple[int, int]]) -> tuple[GraphRoute, ...]:
    """The router's choice (model64.Real.routes) at each (MoE block, position) of `sites`, by
    block and position, each position's experts by weight."""
    out = []
    for layer, pos in sorted(sites):
        if layer not in routes:
            continue
        idx, w, gate = routes[layer]
        pairs = sorted(zip(idx[pos].tolist(), w[pos].tolist(), strict=True), key=lambda p: -p[1])
        out.append(GraphRoute(layer=layer, position=pos, experts=tuple(e for e, _ in pairs),
                              weights=tuple(v for _, v in pairs),
                              shared_gate=None if gate is None else float(gate[pos])))
    return tuple(out)


def moe_sites(family: Family) -> MoeSites:
    """The family's MoE sites."""
    return MoeSites(router=family.router, experts=family.experts, shared=family.shared_experts,
                    shared_gate=family.shared_expert_gate, dense=family.moe_dense_mlp)


def _tensor(module: nn.Module, name: str) -> Tensor:
    """A module's tensor attribute (the experts' 3-D weights)."""
    out: Tensor = getattr(module, name)
    return out


def _scalar(module: nn.Module, name: str) -> float:
    """A module's number attribute (gpt-oss's experts' limit and alpha)."""
    value: float = getattr(module, name)
    return float(value)


def layout(mlp: nn.Module, sites: MoeSites) -> ExpertLayout:
    """The numbering of the MoE block whose MLP module is `mlp`, from its weights' shapes;
    BadInput where its experts are not gated MLPs fptrace can freeze: SwiGLU (act(gate) · up),
    or gpt-oss's clamped SwiGLU (its `limit` and `alpha`), without a norm after each expert."""
    experts = mlp.get_submodule(sites.experts)
    clamped = hasattr(experts, "limit")
    if not getattr(experts, "has_gate", True) or \
            getattr(experts, "has_post_expert_norm", False) or \
            (clamped and (not hasattr(experts, "alpha") or bool(sites.shared))) or \
            (not clamped and not hasattr(experts, "act_fn")):
        raise BadInput(f"graph {param('neurons')}: this model's experts are neither SwiGLU MLPs "
                       "(act(gate) · up) nor gpt-oss's clamped SwiGLU; fptrace cannot freeze "
                       "them yet")
    E, *dims = _tensor(experts, "gate_up_proj").shape  # (E, 2I, d), or (E, d, 2I) transposed
    two_i = dims[1] if getattr(experts, "is_transposed", False) else dims[0]
    shared = 0
    if sites.shared:
        up = mlp.get_submodule(sites.shared).get_submodule(sites.dense[1])
        shared = int(_tensor(up, "weight").shape[0])
    return ExpertLayout(n_experts=int(E), d_expert=int(two_i) // 2, d_shared=shared,
                        limit=_scalar(experts, "limit") if clamped else None,
                        biased=bool(getattr(experts, "has_bias", False)))


def layouts(parts: ModelParts, sites: MoeSites | None) -> dict[int, ExpertLayout]:
    """Each MoE block's numbering (its MLP has the family's router; DeepSeek-V3's first blocks
    are dense and absent); empty for a dense family (sites None)."""
    from fptrace.core.routing import routers

    if sites is None:
        return {}
    return {i: layout(parts.mlps[i], sites) for i, _ in routers(parts)}


def router_hook(routes: dict, layer: int) -> HookFn:
    """A hook on block `layer`'s router: its choice (indices (N, k)) and weights (N, k), as it
    returned them, kept in routes[layer] for the MLP's hook."""
    def hook(module: nn.Module, args: tuple, output: tuple) -> None:
        routes[layer] = (output[2].detach(), output[1].detach())
    return hook


def _pre(mlp: nn.Module, sites: MoeSites, lay: ExpertLayout, x: Tensor,
         idx: Tensor) -> tuple[Tensor, Tensor]:
    """x (N, d), idx (N, k): the gate and up pre-activations (N, width) of every chosen expert's
    neurons at each position (0 where the expert was not chosen), and of the shared experts'."""
    import torch

    from fptrace.families.ops import expert_gate_up

    experts = mlp.get_submodule(sites.experts)
    N = x.shape[0]
    E, I = lay.n_experts, lay.d_expert
    gate = x.new_zeros(N, E, I)
    up = x.new_zeros(N, E, I)
    for e in idx.unique().tolist():
        if not 0 <= e < E:
            continue
        tok = (idx == e).any(dim=-1).nonzero().flatten()  # (n,) the positions that chose e
        g, u = expert_gate_up(x[tok], experts, e)  # (n, I) each, biases included
        at = (tok, torch.full_like(tok, e))
        gate = gate.index_put(at, g)  # (N, E, I)
        up = up.index_put(at, u)
    gate, up = gate.reshape(N, E * I), up.reshape(N, E * I)
    if lay.d_shared and sites.shared:
        shared = mlp.get_submodule(sites.shared)
        gate = torch.cat([gate, shared.get_submodule(sites.dense[0])(x)], dim=-1)
        up = torch.cat([up, shared.get_submodule(sites.dense[1])(x)], dim=-1)
    return gate, up


def _act(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """An MLP's (the experts') activation function, as transformers names it."""
    return cast("Callable[[Tensor], Tensor]", module.act_fn)


def _gate(mlp: nn.Module, sites: MoeSites, lay: ExpertLayout, gate: Tensor) -> Tensor:
    """r (N, width): each neuron's gate act(gate pre-activation), the experts' own function."""
    import torch

    E, I = lay.n_experts, lay.d_expert
    r = _act(mlp.get_submodule(sites.experts))(gate[:, :E * I])
    if lay.d_shared and sites.shared:
        r = torch.cat([r, _act(mlp.get_submodule(sites.shared))(gate[:, E * I:])], dim=-1)
    return r


@dataclass(frozen=True)
class LinearForm:
    """Neurons' activations (N, width) as a linear map of their up pre-activations u, what is
    not linear held (see the module's text): a = r · u (SwiGLU), or a = r · m · u + k (gpt-oss's
    clamped SwiGLU: m 1 where u is within ±limit, else 0; k the constant part)."""

    r: Tensor  # (N, width) the gate factor
    m: Tensor | None  # (N, width) 1 where a follows u, 0 where u is clamped; None: 1 everywhere
    k: Tensor | None  # (N, width) the constant part of a; None: 0

    def of(self, u: Tensor) -> Tensor:
        """The activations at the up pre-activations u (N, width), or (B, N, width) with each
        row taking these held values."""
        if self.m is None or self.k is None:
            return self.r * u
        return self.r * self.m * u + self.k

    def constant(self, up_bias: Tensor | None) -> Tensor | None:
        """(N, width) what no source carries into a: k and the up bias's part r · m · b_up (b_up
        (N, width) the chosen experts' up biases, or None); None where that is 0."""
        c = self.k
        if up_bias is not None:
            rb = self.r * up_bias if self.m is None else self.r * self.m * up_bias
            c = rb if c is None else rb + c
        return c


def _linear_form(mlp: nn.Module, sites: MoeSites, lay: ExpertLayout, gate: Tensor,
                 up: Tensor) -> LinearForm:
    """The LinearForm at the gate and up pre-activations (N, width) each: SwiGLU r = act(gate)
    (the experts' own function); gpt-oss's clamped SwiGLU (transformers' GptOssExperts
    ._apply_gate): r = g · σ(α · g), g = min(gate, limit), a = (clamp(u, ±limit) + 1) · r."""
    import torch

    if lay.limit is None:
        return LinearForm(r=_gate(mlp, sites, lay, gate), m=None, k=None)
    lim = lay.limit
    g = gate.clamp(max=lim)
    r = g * torch.sigmoid(g * _scalar(mlp.get_submodule(sites.experts), "alpha"))  # (N, width)
    inside = (up >= -lim) & (up <= lim)  # a follows u there
    k = r * (1.0 + torch.where(inside, 0.0, up.clamp(min=-lim, max=lim)))  # (N, width)
    return LinearForm(r=r, m=inside.to(up.dtype), k=k)


def _shared_gate(mlp: nn.Module, sites: MoeSites, x: Tensor) -> Tensor | None:
    """(N, 1) the shared experts' gate σ(shared_expert_gate · x), or None (no gate)."""
    import torch

    if not sites.shared or not sites.shared_gate:
        return None
    return torch.sigmoid(mlp.get_submodule(sites.shared_gate)(x))


def _output(mlp: nn.Module, sites: MoeSites, lay: ExpertLayout, a: Tensor, idx: Tensor,
            w: Tensor, g: Tensor | None, bias: bool = True) -> Tensor:
    """(N, d): the block's output from the activations a (N, width): Σ over each position's
    chosen experts of its weight × the expert's down projection of its neurons (its down bias
    added where it has one and `bias`), plus the shared experts' down projection (× their gate
    g (N, 1), or 1)."""
    from fptrace.families.ops import expert_down

    experts = mlp.get_submodule(sites.experts)
    E, I = lay.n_experts, lay.d_expert
    down = _tensor(experts, "down_proj")  # (E, d, I), or (E, I, d) transposed
    d = int(down.shape[2] if getattr(experts, "is_transposed", False) else down.shape[1])
    y = a.new_zeros(a.shape[0], d)
    for e in idx.unique().tolist():
        if not 0 <= e < E:
            continue
        tok, slot = (idx == e).nonzero(as_tuple=True)  # (n,) each
        out = expert_down(a[tok, e * I:(e + 1) * I], experts, e, bias=bias)  # (n, d)
        y = y.index_add(0, tok, out * w[tok, slot, None].to(out.dtype))  # (N, d)
    if lay.d_shared and sites.shared:
        s = mlp.get_submodule(sites.shared).get_submodule(sites.dense[2])(a[:, E * I:])
        y = y + (s if g is None else g * s)
    return y


def _chosen_columns(lay: ExpertLayout, idx: Tensor) -> Tensor:
    """(U,) the neurons (sorted) of the routed experts that idx (N, k) chose somewhere, and the
    shared experts'."""
    import torch

    E, I = lay.n_experts, lay.d_expert
    chosen = [e for e in idx.unique().tolist() if 0 <= e < E]
    cols = [torch.arange(e * I, (e + 1) * I) for e in sorted(chosen)]
    cols.append(torch.arange(E * I, lay.width))
    return torch.cat(cols)


def _check(y: Tensor, own: Tensor, layer: int) -> None:
    """The recomputed block output against the module's own (Mismatch where they differ)."""
    diff = float((y.detach() - own.detach()).abs().max()) if y.numel() else 0.0
    scale = max(float(own.detach().abs().max()) if own.numel() else 0.0, 1e-300)
    rtol = MODULE_RTOL if y.element_size() >= 8 else MODULE_RTOL_FLOAT32
    if diff > rtol * scale:
        raise Mismatch(f"graph: block {layer}'s mixture of experts recomputed from its experts' "
                       f"weights differs from the module's own output by {diff / scale:.2e} "
                       f"(relative; at most {rtol:g})")


def frozen_hook(state: FrozenState, layer: int, sites: MoeSites, lay: ExpertLayout) -> HookFn:
    """The forward hook of block `layer`'s MoE module in the frozen pass: its output replaced by
    the same computation with the routing, the gates and the shared gate frozen and the
    activations a leaf (see the module's text); fills state.acts and state.leaves. In a replay
    (freezing.Replay) every row takes row 0's routing, gates and shared gate, its activations
    held at row 0's or following its up pre-activations, the removed node 0."""
    def hook(module: nn.Module, args: tuple, output: Tensor | tuple) -> Tensor | tuple:
        own = first_output(output)  # (B, T, d)
        x = args[0]
        B, T, d = x.shape
        idx, w = state.routes.pop(layer)  # (B·T, k) each
        xf = x.reshape(B * T, d)
        if state.replay is not None:
            idx, w = (t.view(B, T, -1)[:1].expand(B, T, -1).reshape(B * T, -1) for t in (idx, w))
        gate, up = _pre(module, sites, lay, xf, idx)  # (N, width) each
        g = _shared_gate(module, sites, xf)
        replay = state.replay
        if replay is None:
            form = _linear_form(module, sites, lay, gate.detach(), up.detach())  # frozen
            # the columns: the neurons of the experts chosen somewhere in the pass, and the
            # shared ones (the others are 0 everywhere, without an edge: Pass.columns)
            kept = _chosen_columns(lay, idx).to(x.device)  # (U,) sorted
            state.columns[layer] = kept
            acts = form.of(up)[:, kept]  # (N, U): linear in u
            held = form.constant(_pre(module, sites, lay, xf.detach() * 0, idx)[1]
                                 if lay.biased else None)  # the up biases: u at x = 0
            if held is not None:  # constants in a: bias terms
                state.biases.append((held[:, kept], acts))
            state.acts[layer] = acts.view(B, T, -1)
            leaf = acts.detach().view(B, T, -1).requires_grad_(True)  # edges are direct
            state.leaves[layer] = leaf
            cols = leaf.view(B * T, -1)  # (N, U)
            if form.m is not None:  # a clamped neuron writes a constant: a bias term
                mk = form.m[:, kept]
                fixed = (1.0 - mk) * acts.detach()  # (N, U) the clamped neurons' values
                cols = mk * cols + fixed
                state.biases.append((fixed, cols))
            a = up.new_zeros(up.shape).index_copy(1, kept, cols)  # (N, width)
        else:  # row 0's gates (and clamps)
            form = _linear_form(module, sites, lay, gate.view(B, T, -1)[0],
                                up.view(B, T, -1)[0])
            u = up.view(B, T, -1)
            state.acts[layer] = form.of(u)
            base = form.of(u[:1]).expand(B, T, -1).clone() if replay.hold else form.of(u)
            a = replay.remove(base, layer).reshape(B * T, -1)
            if g is not None:
                g = g.view(B, T, 1)[:1].expand(B, T, 1).reshape(B * T, 1)
        y = _output(module, sites, lay, a, idx, w, None if g is None else g.detach(),
                    bias=False)
        if lay.biased:  # Σ over the chosen experts of w_e · b_down[e]: a bias term
            down_bias = _output(module, sites, lay, a.detach() * 0, idx, w, None)
            y = y + down_bias
            if replay is None:
                state.biases.append((down_bias, y))
        y = y.view(B, T, d)
        if replay is None:
            _check(y, own, layer)
        return (y, *output[1:]) if isinstance(output, tuple) else y
    return hook


def real_hooks(mlp: nn.Module, layer: int, sites: MoeSites, lay: ExpertLayout, acts: dict,
               routes: dict, clamped: dict) -> list[Hook]:
    """Hooks for the real pass (no gradient) of the MoE block `layer`: acts[layer] (T, width)
    every chosen expert's neuron activation act(gate) · up (0 for the experts not chosen),
    recomputed from the MLP's input and the router's own choice and checked to give the
    module's output; routes[layer]: the router's (indices (T, k), weights (T, k));
    clamped[layer] (T, width) bool, gpt-oss's experts only: the neurons whose up
    pre-activation is clamped (a constant under the freezing: no node)."""
    seen: dict[int, tuple[Tensor, Tensor]] = {}

    def hook(module: nn.Module, args: tuple, output: Tensor | tuple) -> None:
        x = args[0][0]  # (T, d), row 0
        idx, w = seen.pop(layer)
        T = x.shape[0]
        idx, w = idx[:T], w[:T]
        gate, up = _pre(module, sites, lay, x, idx)
        form = _linear_form(module, sites, lay, gate, up)
        a = form.of(up)  # (T, width)
        if form.m is not None:
            clamped[layer] = (form.m == 0).cpu()
        _check(_output(module, sites, lay, a, idx, w, _shared_gate(module, sites, x)),
               first_output(output)[0], layer)
        acts[layer] = a.detach().cpu().clone()
        g = _shared_gate(module, sites, x)  # (T, 1) or None
        routes[layer] = (idx.detach().cpu().clone(), w.detach().double().cpu().clone(),
                         None if g is None else g.detach().double().cpu()[:, 0])
    return [Hook.after(mlp.get_submodule(sites.router), router_hook(seen, layer)),
            Hook.after(mlp, hook)]


def removal_hooks(mlp: nn.Module, layer: int, sites: MoeSites, lay: ExpertLayout,
                  removed: list[tuple[int, int, int]]) -> list[Hook]:
    """Hooks for a pass with nothing frozen (graph --verify's `real`): in batch row b the
    neuron `index` of block `layer` at `position` set to 0 for each (b, position, index) of
    `removed`, the block's output recomputed from its input and the router's own choice in
    that row (the rest of the computation as the model does it)."""
    seen: dict[int, tuple[Tensor, Tensor]] = {}

    def hook(module: nn.Module, args: tuple, output: Tensor | tuple) -> Tensor | tuple:
        x = args[0]
        B, T, d = x.shape
        idx, w = seen.pop(layer)
        xf = x.reshape(B * T, d)
        gate, up = _pre(module, sites, lay, xf, idx)
        a = _linear_form(module, sites, lay, gate, up).of(up).view(B, T, -1).clone()
        for b, pos, index in removed:
            a[b, pos, index] = 0.0
        y = _output(module, sites, lay, a.view(B * T, -1), idx, w,
                    _shared_gate(module, sites, xf)).view(B, T, d)
        return (y, *output[1:]) if isinstance(output, tuple) else y
    return [Hook.after(mlp.get_submodule(sites.router), router_hook(seen, layer)),
            Hook.after(mlp, hook)]


__all__ = ["CLAMPED_FREEZING", "MOE_FREEZING", "ExpertLayout", "LinearForm", "MoeSites",
           "frozen_hook", "graph_routes", "layout",
           "layouts", "moe_sites", "neuron_fields", "neuron_name", "real_hooks", "removal_hooks",
           "router_hook"]
