"""`fptrace explain`: recompute one block of a real model step by step, from its own weights,
and check every recomputed tensor that the model also produces against the model.

The model runs once with hooks on the chosen block (its input, attention output, MLP output and
output) and on the last block. The family module (gpt2.py, llama.py) then recomputes the block
in float32 from the captured input, recording each step; the end of the pass (final norm, last
position, unembedding, softmax, sampling) is recomputed from the model's last block output.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from fptrace.addresses import Block, Index, resolve_block, resolve_index
from fptrace.commands.explain.embedding import embedding
from fptrace.commands.explain.notes import END_OF_PASS, MATRIX_LIMIT
from fptrace.commands.explain.result import AttentionMatrix, Explanation, Sampling, SamplingRow
from fptrace.core import sampling
from fptrace.core.hooks import Hook, first_output, hooked
from fptrace.core.routing import routers
from fptrace.core.trace import base_notes, model_info, sizes
from fptrace.errors import BadInput, UnsupportedModel, param
from fptrace.families import Family, with_walkthrough
from fptrace.families.ops import Steps
from fptrace.models.loading import LoadedModel
from fptrace.models.prompts import Prompt
from fptrace.models.tensor_parallel import full
from fptrace.points import Point
from fptrace.results import Check, Token, TopToken

if TYPE_CHECKING:
    import types

    import torch
    from torch import nn

# (atol, rtol) of a recomputed tensor against the model's, by its dtype (see _close). The
# recomputation runs in float32, so against
# a half-precision model the gap is the model's own rounding.
TOLERANCE = {"float32": (1e-5, 1e-5), "float64": (1e-7, 1e-7), "bfloat16": (2e-2, 2e-2),
             "float16": (5e-3, 5e-3)}


def covered(family: Family) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The family's recomputation of a block and of the final norm (families/), or
    UnsupportedModel where it has none."""
    block, final_norm = family.recompute_block, family.recompute_final_norm
    if block is None or final_norm is None:
        raise UnsupportedModel(f"explain has no walkthrough for the {family.name} family yet; "
                               f"it supports {with_walkthrough()}")
    return block, final_norm


@contextlib.contextmanager
def _captured(lm: LoadedModel, layer: int) -> Iterator[dict]:
    """Hooks that keep the chosen block's input, attention and MLP outputs and output, and the
    last block's output; removed whatever happens."""
    parts = lm.parts
    got: dict[str, Any] = {}

    def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
        got["block_in"] = (args[0] if args else kwargs["hidden_states"]).detach().clone()

    def keep(name: str):
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            got[name] = first_output(output).detach().clone()
        return hook

    def embed_out(module: nn.Module, args: tuple, kwargs: dict) -> None:
        got["embed_out"] = (args[0] if args else kwargs["hidden_states"]).detach().clone()

    def mlp_in(module: nn.Module, args: tuple, kwargs: dict) -> None:
        got["mlp_in"] = (args[0] if args else next(iter(kwargs.values()))).detach().clone()

    def router_out(module: nn.Module, args: tuple, output: tuple) -> None:
        got["router"] = tuple(t.detach().clone() for t in output[:3])

    moe = [Hook.after(r, router_out) for i, r in routers(parts) if i == layer]
    with hooked(moe + [Hook.before(parts.blocks[0], embed_out, kwargs=True),
                       Hook.before(parts.mlps[layer], mlp_in, kwargs=True),
                       Hook.after(parts.mlps[layer], keep("mlp_module_out")),
                       Hook.before(parts.blocks[layer], pre, kwargs=True),
                       Hook.after(parts.blocks[layer], keep("block_out")),
                       Hook.after(parts.attn_adds[layer], keep("attn_out")),
                       Hook.after(parts.mlp_adds[layer], keep("mlp_out")),
                       Hook.after(parts.blocks[-1], keep("last_out"))]):
        yield got


def _float32(module: nn.Module) -> nn.Module | types.SimpleNamespace:
    """The module itself when it is already float32 and whole; else its float32 weights: a copy
    (one block, or the final norm: small), or, when the model is sharded over tensor-parallel
    ranks, a plain object tree with each module's whole weights (`full_tensor()`), which is
    all the walkthrough reads."""
    import torch

    params = list(module.parameters())
    if any(hasattr(p, "full_tensor") for p in params):
        return _whole(module)
    if not params or params[0].dtype == torch.float32:
        return module
    return copy.deepcopy(module).float()


def _whole(module: nn.Module) -> types.SimpleNamespace:
    import types

    tree = types.SimpleNamespace(**{name: _whole(child)
                                    for name, child in module.named_children()})
    for name, p in module.named_parameters(recurse=False):
        setattr(tree, name, full(p).detach().float())
    if hasattr(module, "bias") and module.bias is None:
        tree.bias = None
    return tree


def _close(name: str, ours: torch.Tensor, theirs: torch.Tensor, tol: tuple[float, float],
           target: str) -> Check:
    """Every element within atol + rtol × the largest |value| of its row (its position) in the
    model's tensor: float32 sums that cancel (a residual add of two large vectors) leave an
    error relative to the row's scale, not to the small result. The value shown is
    max |ours − theirs|."""
    atol, rtol = tol
    theirs = theirs.float()
    diff = (ours - theirs).abs()
    scale = theirs.abs().amax(dim=-1, keepdim=True)
    ok = bool((diff <= atol + rtol * scale).all())
    return Check(name=name, value=float(diff.max()), tolerance=f"{atol:g} + {rtol:g}·max|row|",
                 ok=ok, target=target)


def explain(lm: LoadedModel, prompt: Prompt, *, layer: int | Block = 0, head: int | Index = 0,
            temperature: float = 0.8, top_k: int = 10, top_p: float = 0.9, seed: int = 0,
            show: int = 8, max_matrix: int = 12, all_heads: bool = False) -> Explanation:
    """Walk through block `layer` for head `head` (each negative counts from the end), then the
    end of the pass and the sampling choices."""
    import torch

    sampling.check_options(temperature, top_k, top_p)
    fam = lm.parts.family
    recompute_block, recompute_final_norm = covered(fam)
    info = model_info(lm)
    layer = resolve_block(layer, sizes(lm), "layer").layer
    head = resolve_index(head, info.n_heads, "head", f"each block of {lm.name}", "head")
    if show < 1:
        raise BadInput(f"{param('show')} must be at least 1")
    prepared = lm.prepare(prompt)
    ids = list(prepared.ids)
    cfg = lm.config
    input_ids = torch.tensor([ids], dtype=torch.long, device=lm.device)  # (1, T)
    with torch.inference_mode(), _captured(lm, layer) as got:
        out = lm.model(input_ids, use_cache=False, logits_to_keep=1)
    model_logits = out.logits[0, -1].float()  # (V,)

    tol = TOLERANCE.get(info.dtype, TOLERANCE["bfloat16"])
    kv_head = head // (info.n_heads // info.n_kv_heads)
    s = Steps(head=head, kv_head=kv_head, n_heads=info.n_heads, n_kv_heads=info.n_kv_heads)
    with torch.inference_mode():
        x0, embedding_rows = embedding(lm, ids, s)  # (1, T, C)
        embed_check = _close("embedding = the stream entering block 0", x0, got["embed_out"],
                             tol, "embedding")
        y = recompute_block(got["block_in"].float(), _float32(lm.parts.blocks[layer]), cfg,
                            layer, s, lm.model, fam)  # (1, T, C)
        checks = [embed_check] + _attention_checks(s)
        checks += [
            _close(f"attention output = the model's "
                   f"{lm.parts.family.attn_added or lm.parts.family.attn} output",
                   s.kept[_last_named(s, "attention")], got["attn_out"], tol, "attn_out"),
            _close(f"MLP output = the model's "
                   f"{lm.parts.family.mlp_added or lm.parts.family.mlp} output",
                   s.kept[_last_named(s, "mlp")], got["mlp_out"], tol, "mlp_out"),
            _close(f"block {layer} output = the model's block {layer} output", y,
                   got["block_out"], tol, "block"),
        ]
        if "router" in got and "router logits" in s.kept:
            checks += _router_checks(s, got["router"], tol)
        logits, end_checks = _end_of_pass(lm, recompute_final_norm, got["last_out"].float(), s,
                                          model_logits, tol)
        checks += end_checks
        checks.append(_per_position(lm, layer, got, tol))
    toks = lm.tokens(prepared)
    matrices = _matrices(s, toks, head) if len(ids) <= max_matrix else ()
    notes = base_notes(lm)
    if layer != info.n_layers - 1:
        notes.append(END_OF_PASS(last=info.n_layers - 1, layer=layer))
    if len(ids) > max_matrix:
        notes.append(MATRIX_LIMIT(n=max_matrix))
    return Explanation(
        prompt=prepared.text, model=info, tokens=toks, layer=layer, head=head,
        kv_head=kv_head, steps=tuple(s.items), matrices=matrices, checks=tuple(checks),
        sampling=_sampling(lm, logits, temperature, top_k, top_p, seed, show),
        match=all(c.ok for c in checks), notes=tuple(notes),
        head_weights=_all_heads(s, toks) if all_heads else (), embedding=embedding_rows)


def _router_checks(s: Steps, router: tuple, tol: tuple[float, float]) -> list[Check]:
    """The recomputed router logits, choice and weights against what the block's own router
    returned (logits (N, E), weights (N, k), indices (N, k)), every position."""
    logits, weights, indices = router
    E = logits.shape[-1]
    ours = s.kept["router logits"].reshape(-1, E)  # (N, E)
    idx = s.kept["top-k experts"].reshape(indices.shape).long()  # (N, k)
    w = s.kept["expert weights"].reshape(weights.shape)  # (N, k)
    mine, theirs = idx.sort(dim=-1), indices.sort(dim=-1)
    wrong = int((mine.values != theirs.values).any(dim=-1).sum())
    return [
        _close("router logits = the model's router logits", ours, logits, tol, "router_logits"),
        Check("chosen experts = the router's, every position (count of positions differing)",
              float(wrong), "= 0", wrong == 0, target="router_choice", unit="count"),
        _close("expert weights = the router's weights", w.gather(-1, mine.indices),
               weights.float().gather(-1, theirs.indices), tol, "router_weights"),
    ]


def _per_position(lm: LoadedModel, layer: int, got: dict, tol: tuple[float, float]) -> Check:
    """Attention is the only step that mixes positions: the model's own MLP (of this block) and
    final norm, run on the first and the last position alone, give those positions' rows of
    their run on the whole prompt."""
    import torch

    x, y = got["mlp_in"], got["mlp_module_out"]  # (1, T, C) each
    z = got["last_out"]  # (1, T, C): the final norm's input
    ours, theirs = [], []
    with torch.inference_mode():
        whole_norm = lm.parts.final_norm(z)  # (1, T, C)
        for k in sorted({0, x.shape[1] - 1}):
            ours += [first_output(lm.parts.mlps[layer](x[:, k:k + 1])).float(),
                     lm.parts.final_norm(z[:, k:k + 1]).float()]  # (1, 1, C) each
            theirs += [y[:, k:k + 1], whole_norm[:, k:k + 1]]
    return _close("MLP and final norm per position: run alone = its row", torch.cat(ours, 1),
                  torch.cat(theirs, 1), tol, "per_position")


def _last_named(s: Steps, section: str) -> str:
    """The name of the last kept tensor of a section: the attention or MLP output."""
    names = [st.name for st in s.items if st.section == section and st.name in s.kept]
    return names[-1]


def _attention_checks(s: Steps) -> list[Check]:
    import torch

    w = s.kept["softmax"]  # (B, nh, T, T)
    sink = s.kept.get("sink weight")  # (B, nh, T): the share of each row a sink took (gpt-oss)
    row_err = float((w.sum(dim=-1) + (0 if sink is None else sink) - 1).abs().max())
    T = w.shape[-1]
    above = torch.ones(T, T, dtype=torch.bool, device=w.device).triu(1)
    nonzero = int((w[..., above] != 0).sum())
    return [Check("softmax rows sum to 1 (max |Σ − 1|)" if sink is None else
                  "softmax rows and their sink weight sum to 1 (max |Σ + sink − 1|)", row_err,
                  "≤ 1e-05", row_err <= 1e-5, target="softmax_rows"),
            Check("weights above the diagonal are exactly 0 (count of non-zero)",
                  float(nonzero), "= 0", nonzero == 0, target="causal_zeros", unit="count")]


def _end_of_pass(lm: LoadedModel, final_norm: Callable[..., Any], x: torch.Tensor, s: Steps,
                 model_logits: torch.Tensor, tol: tuple[float, float]
                 ) -> tuple[torch.Tensor, list[Check]]:
    import torch

    s.section = "end"
    h = final_norm(x, _float32(lm.parts.final_norm), lm.config, s)  # (B, T, C)
    h = h[:, -1, :]  # (B, C)
    s("last position", "h = h[:, −1]   (only the last position predicts the next token)", h)
    head = lm.parts.lm_head
    W_U = full(head.weight).float()  # (V, C)
    logits = h @ W_U.T  # (B, V)
    if getattr(head, "bias", None) is not None:
        logits = logits + full(head.bias).float()
    tied = model_info(lm).tied_embeddings
    cap = lm.parts.final_softcap
    s("lm_head (unembed)", f"logits = h · W_Uᵀ   W_U is {tuple(W_U.shape)}", logits,
      note="tied: W_U is the token embedding matrix" if tied
      else "untied: W_U is its own matrix, not the token embedding",
      point=None if cap else Point.logits)
    if cap:
        logits = torch.tanh(logits / cap) * cap  # (B, V)
        s("final softcap", f"logits = {cap:g} · tanh(logits / {cap:g})", logits,
          point=Point.logits)
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    s("softmax", "p = exp(logits) / Σ exp(logits)", probs)
    return logits[0], [_close("logits = the model's logits (last position)", logits[0],
                              model_logits, tol, "logits")]


def _matrices(s: Steps, toks: tuple[Token, ...], head: int) -> tuple[AttentionMatrix, ...]:
    labels = tuple(t.text for t in toks)
    out = []
    for name, key in (("scores + mask", "scores + mask"), ("weights", "softmax")):
        m = s.kept[key][0, head].float().cpu()  # (T, T)
        out.append(AttentionMatrix(name=name, head=head, labels=labels,
                                   rows=tuple(tuple(float(v) for v in r) for r in m.tolist())))
    return tuple(out)


def _all_heads(s: Steps, toks: tuple[Token, ...]) -> tuple[AttentionMatrix, ...]:
    labels = tuple(t.text for t in toks)
    w = s.kept["softmax"][0].float().cpu()  # (nh, T, T)
    return tuple(AttentionMatrix(name="weights", head=h, labels=labels,
                                 rows=tuple(tuple(float(v) for v in r) for r in w[h].tolist()))
                 for h in range(w.shape[0]))


def _sampling(lm: LoadedModel, logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
              seed: int, show: int) -> Sampling:
    import torch

    ways = sampling.strategies(logits, temperature, top_k, top_p)
    picks = [int(torch.argmax(dist)) if i == 0 else sampling.draw(dist, seed)
             for i, (_, dist) in enumerate(ways)]
    base = torch.softmax(logits.float(), dim=-1)
    shown = base.topk(min(show, base.shape[-1])).indices.tolist()
    shown += [p for p in dict.fromkeys(picks) if p not in shown]
    rows = tuple(SamplingRow(id=i, text=lm.token_text(i), logit=float(logits[i]),
                             probs=tuple(float(dist[i]) for _, dist in ways)) for i in shown)
    return Sampling(
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
        strategies=tuple(name for name, _ in ways),
        kept=tuple(int((dist > 0).sum()) for _, dist in ways),
        picks=tuple(TopToken(rank=k + 1, id=p, text=lm.token_text(p), prob=float(ways[k][1][p]),
                             logit=float(logits[p])) for k, p in enumerate(picks)),
        rows=rows)


