"""The OV circuit of every head, from the weights alone (Elhage et al. 2021).

Head h of block l maps a token's embedding e to logits: the block's attention input norm (the
module itself, applied to e), the head's W_V rows (its K/V group's under GQA), its W_O columns,
the attention post-norm's gain where the family has one, the final norm's gain (and centring for
a LayerNorm), the LM head. The norms' scales are positive numbers per vector, which move no
argmax; the post-norm's and the final norm's are left out (the copying share is exact without
them; the eigenvalue measure counts them as 1).

- copying share: of `n` seeded sampled tokens, the share whose own logit is the largest of the
  whole vocabulary (n = 0: not computed, null); decided as the whole product's argmax decides it,
  at a fraction of its cost (`own_is_largest`);
- eigenvalue measure: Σλ / Σ|λ| over the eigenvalues of the (V, V) circuit, computed as those of
  the (hd, hd) matrix W_V^h · diag(g₁) · Ẽᵀ·Ũ · W_O^h (the nonzero eigenvalues of AB and BA
  agree), Ẽ the embedding rows at the input norm's scale, Ũ the LM head through the gains.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fptrace.core.trace import model_info
from fptrace.families.kinds import NormKind
from fptrace.families.parts import output_projection
from fptrace.models.loading import LoadedModel

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class OV:
    copying: list | None  # (L, H) floats
    eigen: list | None
    notes: list = field(default_factory=list)
    checks: list = field(default_factory=list)


def value_weights(attn: nn.Module, nh: int, nkv: int, hd: int) -> torch.Tensor | None:
    """W_V (nkv·hd, d) float32: v_proj, or the third of GPT-2's fused c_attn; None where the
    attention module has neither."""
    v = getattr(attn, "v_proj", None)
    if v is not None:
        return v.weight.float()
    c = getattr(attn, "c_attn", None)
    if c is not None and type(c).__name__ == "Conv1D" and c.weight.shape[1] == 3 * nh * hd:
        C = nh * hd
        return c.weight[:, 2 * C:3 * C].T.float()
    return None


def _gain(module: nn.Module | None, kind: NormKind, d: int) -> torch.Tensor:
    import torch

    w = getattr(module, "weight", None)
    if w is None:
        return torch.ones(d)
    w = w.float().cpu()
    return 1.0 + w if kind.is_rms and kind.one_plus else w


PROBE = 2048  # vocabulary rows in own_is_largest's first product
WHOLE_ROWS = 1024  # rows a product with the whole vocabulary takes (V floats a row) ...
OV_ROWS = 16384  # ... and rows (a sampled token through a head) an own_is_largest call


def own_is_largest(O: torch.Tensor, U: torch.Tensor, own: torch.Tensor,
                   u_max: torch.Tensor | None = None) -> torch.Tensor:
    """Per row r of O (m, d): whether the logit of token own[r] is the largest of O[r] @ U.T,
    the first of equals: what `(O @ U.T).argmax(-1) == own` says, computing the whole vocabulary
    only for the rows a first product with PROBE evenly spaced rows of U cannot rule out. A row is
    ruled out where one of those logits exceeds its own by more than four times the rounding
    bound of a float32 dot product, γ_d·‖O[r]‖·max_v ‖U[v]‖ with γ_d = d·2⁻²⁴/(1 − d·2⁻²⁴)
    (Higham), so that the whole product, in any order of summation, ranks the two the same way.
    A row that holds NaN or Inf is never ruled out (every comparison with NaN is false).
    u_max: max_v ‖U[v]‖ where the caller has it (U's rows are long to go over)."""
    import torch

    m, d = O.shape
    V = U.shape[0]
    if m == 0:
        return torch.zeros(0, dtype=torch.bool)
    if V <= 2 * PROBE:
        return torch.cat([(o @ U.T).argmax(-1) for o in O.split(WHOLE_ROWS)]) == own
    u = 2.0 ** -24
    gamma = d * u / (1 - d * u)
    if u_max is None:
        u_max = U.norm(dim=-1).max()
    bound = gamma * O.norm(dim=-1) * u_max  # (m,)
    mine = (O * U[own]).sum(-1)  # (m,)
    best = (O @ U[::V // PROBE].T).max(-1).values  # (m,)
    left = ~(best - mine > 4 * bound)
    got = torch.zeros(m, dtype=torch.bool)
    for rows in left.nonzero().flatten().split(WHOLE_ROWS):
        got[rows] = (O[rows] @ U.T).argmax(-1) == own[rows]
    return got


def _copying(parts: list, U: torch.Tensor, sample: torch.Tensor, u_max: torch.Tensor | None,
             H: int, nkv: int, hd: int) -> list[list[float]]:
    """Per part (a block's values of the sampled tokens (n, nkv·hd) and its W_O (d, H·hd)), per
    head: the share of the sampled tokens whose own logit is the largest (own_is_largest), the
    tokens taken a chunk at a time so that a call holds at most OV_ROWS rows (every part's heads
    at once)."""
    import torch

    n = len(sample)
    per = max(1, OV_ROWS // (len(parts) * H))
    hits = torch.zeros(len(parts), H)
    for start in range(0, n, per):
        some = slice(start, start + per)
        rows = torch.cat([v[some, (h // (H // nkv)) * hd:(h // (H // nkv) + 1) * hd]
                          @ Wo[:, h * hd:(h + 1) * hd].T for v, Wo in parts for h in range(H)])
        own = own_is_largest(rows, U, sample[some].repeat(len(parts) * H), u_max)
        hits += own.view(len(parts), H, -1).sum(-1)
    return (hits / n).tolist()


def ov_scores(lm: LoadedModel, seed: int, n: int) -> OV | None:
    """Both scores for every head (the copying share only with n ≥ 1), or None (with a note)
    where a family's W_V or norms cannot be read."""
    import torch

    from fptrace.commands.heads.notes import HEADS_NO_OV

    info = model_info(lm)
    fam = lm.parts.family
    L, H, hd = info.n_layers, info.n_heads, info.head_dim
    nkv = info.n_kv_heads or H
    kind = fam.norm_type
    if kind is not NormKind.layernorm and not kind.is_rms:
        return OV(None, None, notes=[HEADS_NO_OV(family=fam.title)])
    with torch.inference_mode():
        E = lm.parts.embed.weight.float().cpu()  # (V, d)
        U = lm.parts.lm_head.weight.float().cpu()  # (V, d)
        V, d = E.shape
        centre = kind is NormKind.layernorm
        Uf = U * _gain(lm.parts.final_norm, kind, d)  # (V, d)
        if centre:
            Uf = Uf - Uf.mean(-1, keepdim=True)
        norms: list[nn.Module | None] = [
            None if fam.attn_norm is None else b.get_submodule(fam.attn_norm)
            for b in lm.parts.blocks]
        # the input norm's scale of each embedding row (the first block's eps; the gains per
        # block below)
        Ec = E - E.mean(-1, keepdim=True) if centre and norms[0] is not None else E
        if norms[0] is not None:
            eps = getattr(norms[0], "variance_epsilon", None) or getattr(norms[0], "eps", 1e-5)
            Ec = Ec * torch.rsqrt(Ec.pow(2).mean(-1, keepdim=True) + eps)
        K = Ec.T @ Uf  # (d, d)
        Uf_max = Uf.norm(dim=-1).max() if n else None  # the largest row norm, for the bound
        g = torch.Generator().manual_seed(seed)
        sample = torch.randperm(V, generator=g)[:n]  # (n,)
        copying, eigen = [], []
        shared = []  # each block's (values, W_O) read against Uf itself: decided at the end
        for layer in range(L):
            attn = lm.parts.attns[layer]
            Wv = value_weights(attn, H, nkv, hd)
            if Wv is None or Wv.shape != (nkv * hd, d):
                return OV(None, None, notes=[HEADS_NO_OV(family=fam.title)])
            Wv = Wv.cpu()
            _, (Wo, _) = output_projection(attn, fam.w_o)
            Wo = Wo.cpu()  # (d, H·hd)
            g1 = torch.ones(d) if norms[layer] is None else _gain(norms[layer], kind, d)
            Ul, Kl, Umax = Uf, K, Uf_max
            if fam.attn_added:
                gp = _gain(lm.parts.attn_adds[layer], kind, d)
                Ul, Kl = Uf * gp, K * gp
                Umax = Ul.norm(dim=-1).max() if n else None
            x = E[sample].to(lm.parts.embed.weight.device, lm.parts.embed.weight.dtype)
            norm = norms[layer]
            if norm is not None:
                x = norm(x[None])[0]
            v = x.float().cpu() @ Wv.T  # (n, nkv·hd)
            VK = (Wv * g1) @ Kl  # (nkv·hd, d): once per K/V head, shared by its group
            row_e = []
            for h in range(H):
                kv = h // (H // nkv)
                Woh = Wo[:, h * hd:(h + 1) * hd]  # (d, hd)
                lam = torch.linalg.eigvals(VK[kv * hd:(kv + 1) * hd] @ Woh)  # (hd,)
                row_e.append(float(lam.real.sum() / lam.abs().sum().clamp(min=1e-30)))
            if n and fam.attn_added:  # every head's rows at once against its own gains
                copying.append(_copying([(v, Wo)], Ul, sample, Umax, H, nkv, hd)[0])
            elif n:
                shared.append((v, Wo))
            eigen.append(row_e)
        if shared:  # every block's rows against the one LM head at once: the whole vocabulary
            # read once for the rows the probe leaves, not once a block (each row's answer is
            # its own: own_is_largest decides row by row)
            copying = _copying(shared, Uf, sample, Uf_max, H, nkv, hd)
    return OV(copying if n else None, eigen)


__all__ = ["OV", "PROBE", "ov_scores", "own_is_largest", "value_weights"]
