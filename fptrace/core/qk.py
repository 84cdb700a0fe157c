"""The split of one attention score into query-part × key-part terms that sum exactly: the
machinery `attribute --qk` and `graph --qk` share.

The score of query position i on key position j in head h of block L is
scale · q_i · k_j (before the softmax, the mask and any softcap). The stream entering block L at
a position is a sum of parts: the embedding (and the learned position embedding), what each
earlier head wrote through its columns of W_O (through its block's post-norm, frozen at its
actual scale, where the family has one), each W_O bias, each earlier MLP. q_i is linear in the
stream at i once the norm in front of attention is frozen at its actual scale there (so is k_j at
j): the frozen norm, W_Q (W_K), the q/k norm frozen likewise, and the rotation of RoPE at that
position are each linear. So the score is Σ over query parts a and key parts b of
scale · q(a) · k(b), and the constants of each side (the norm's bias through W_Q, the
projection's bias) are one more part, `bias`.

One forward pass, with the model's eager attention, keeps the parts at the two positions, the
stream entering block L and the model's own weights of the head's row (split_score). It checks
that the parts sum to the stream the model had, that the terms sum to the score computed from
the whole streams, and that the weights recomputed the same way equal the model's own. The
forward stops after block L's attention: later blocks cannot change the score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fptrace.core.attribution import HALF_RTOL, RTOL, frozen_norm, head_parts, through_frozen
from fptrace.core.hooks import Hook, StopForward, eager_attention, first_output, hooked
from fptrace.core.trace import model_info
from fptrace.errors import BadInput, UnsupportedModel
from fptrace.families.kinds import PositionKind, QkNorm
from fptrace.families.ops import (
    apply_rope,
    attention_scale,
    rope_tables,
    rotary_dims,
    sliding_window,
)
from fptrace.families.parts import output_projection
from fptrace.models.loading import LoadedModel
from fptrace.notes import HEADS_UNSPLIT
from fptrace.results import Check, QKPart, QKPartSum, QKTerm

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch
    from torch import nn

    from fptrace.results import ModelInfo

KEEP_BYTES = 256 * 2**20  # most kept of every earlier block at every position in one pass
GRID = 8  # rows and columns of the grid (and its heatmap) before the `rest` row and column


@dataclass(frozen=True)
class ScoreSplit:
    """One score split (see the module's text): the fields of attribute's QKAttribution that
    do not depend on the command (its docstrings say what each is)."""

    layer: int
    head: int
    kv_head: int
    query: int
    key: int
    most_attended: int
    scale: float
    score: float
    stream_score: float
    softcap: float | None
    capped_score: float | None
    window: int | None
    weight: float
    recomputed_weight: float
    n_terms: int
    top: tuple[QKTerm, ...]
    rest: float
    query_parts: tuple[QKPartSum, ...]
    key_parts: tuple[QKPartSum, ...]
    grid_rows: tuple[QKPart, ...]
    grid_columns: tuple[QKPart, ...]
    grid: tuple[tuple[float, ...], ...]
    checks: tuple[Check, ...]
    notes: tuple[str, ...]  # the blocks whose heads could not be split

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def split_score(lm: LoadedModel, ids: list[int], layer: int, head: int, i: int,
                j: int | None, top: int = 12) -> ScoreSplit:
    """The score of head `head` of block `layer` (resolved, not negative) at query position i
    on key position j (None: the key it attends to most) of the token ids, split into
    query-part × key-part terms: the `top` largest, the rest summed."""
    import torch

    fam = lm.parts.family
    if fam.qk_weights is None:
        raise UnsupportedModel(f"the split of an attention score needs the {fam.name} family's "
                               "record of where the norm before attention and W_Q, W_K are; "
                               "it has none")
    info = model_info(lm)
    window = sliding_window(lm.config, layer)
    if j is not None:
        visible_key(i, j, window, layer)
    with torch.inference_mode():
        if j is None and kept_bytes(lm, info, layer, i + 1) > KEEP_BYTES:
            # the key is not known before block `layer` runs: rather than keep every position
            # of every earlier block, a first pass (stopped there too) finds it
            j = int(qk_forward(lm, ids, layer, head, i, None)["weights"].argmax())
        keep = sorted({i, j}) if j is not None else list(range(i + 1))
        got = qk_forward(lm, ids, layer, head, i, keep)
        row = got["weights"]  # (i + 1,) the model's weights of query i over keys 0..i
        most = int(row.argmax())
        j = most if j is None else j
        return _split(lm, info, len(ids), layer, head, i, j, keep, got, window, most, top)


def visible_key(i: int, j: int, window: int | None, layer: int) -> None:
    """BadInput where query i cannot see key j (after it, or outside the sliding window)."""
    if j > i:
        raise BadInput(f"key {j} comes after query {i}: the causal mask hides it (its score is "
                       f"−∞ and its weight 0); choose a key from 0 to {i}")
    if window and i - j >= window:
        raise BadInput(f"key {j} is outside block {layer}'s sliding window of {window} tokens: "
                       f"query {i} sees keys {i - window + 1}..{i} (key {j} has weight 0)")


def kept_bytes(lm: LoadedModel, info: ModelInfo, layer: int, n: int) -> int:
    """What one pass keeps at n positions: per earlier block the heads entering W_O, what
    attention and the MLP added (and W_O's output, before a post-norm)."""
    import torch

    per = info.n_heads * info.head_dim + (3 if lm.parts.family.attn_added else 2) * info.d_model
    return layer * n * per * torch.empty((), dtype=lm.dtype).element_size()


def qk_forward(lm: LoadedModel, ids: list[int], layer: int, head: int, i: int,
               keep: list[int] | None) -> dict:
    """One forward pass, eager attention, stopped after block `layer`'s attention: the parts of
    the stream at the kept positions from every earlier block (none when keep is None), the
    stream entering block `layer` at positions 0..i, and the model's weights of head `head` at
    query i. Kept in the model's dtype, on the device of the embedding."""
    import torch

    parts = lm.parts
    fam = parts.family
    home = lm.device
    rows = torch.tensor(keep or [i], device=home)
    got: dict[str, Any] = {k: [None] * layer for k in ("y", "o", "attn", "mlp")}

    def take(h: torch.Tensor) -> torch.Tensor:  # (1, T, X) -> (len(keep), X), a copy
        return h[0].index_select(0, rows.to(h.device)).to(home)

    def keep_in(store: list, n: int):
        def hook(module: nn.Module, args: tuple) -> None:
            store[n] = take(args[0])
        return hook

    def keep_out(store: list, n: int):
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            store[n] = take(first_output(output))
        return hook

    def embed(module: nn.Module, args: tuple, kwargs: dict) -> None:
        got["embed"] = take(args[0] if args else kwargs["hidden_states"])

    def stream(module: nn.Module, args: tuple, kwargs: dict) -> None:
        h = args[0] if args else kwargs["hidden_states"]
        got["stream"] = h[0, :i + 1].to(home, torch.float64)  # (i + 1, d)

    def weights(module: nn.Module, args: tuple, output: object) -> None:
        w = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
        got["weights"] = None if w is None else w[0, head, i, :i + 1].to(home).double()
        raise StopForward  # nothing after block L's attention changes the score

    hooks = [Hook.before(parts.blocks[0], embed, kwargs=True),
             Hook.before(parts.blocks[layer], stream, kwargs=True),
             Hook.after(parts.attns[layer], weights)]
    for n in range(layer if keep is not None else 0):
        proj, _ = output_projection(parts.attns[n], fam.w_o)
        hooks.append(Hook.before(proj, keep_in(got["y"], n)))
        if fam.attn_added:
            hooks.append(Hook.before(parts.attn_adds[n], keep_in(got["o"], n)))
        hooks.append(Hook.after(parts.attn_adds[n], keep_out(got["attn"], n)))
        hooks.append(Hook.after(parts.mlp_adds[n], keep_out(got["mlp"], n)))
    try:
        with eager_attention(lm.model), hooked(hooks):
            lm.model(torch.tensor([ids], device=home), use_cache=False, logits_to_keep=1)
    except StopForward:
        pass
    if got.get("weights") is None:
        raise UnsupportedModel(f"block {layer}'s attention did not return its weights under "
                               "eager attention, so the weight cannot be checked")
    return got


def stream_parts(lm: LoadedModel, got: dict, layer: int, positions: Sequence[int],
                  keep: list[int], dtype: str) -> tuple[list, dict, list[str]]:
    """The parts of the stream entering block `layer` at each position: labels (one list for
    every position), {position: (P, d) float64}, and notes (blocks not split per head)."""
    import torch

    parts = lm.parts
    fam = parts.family
    info = model_info(lm)
    nh, hd = info.n_heads, info.head_dim
    sel = [keep.index(p) for p in positions]

    def rows(t: Any) -> Any:  # the kept rows of these positions, float64
        return None if t is None else t[sel].double()

    y, o, attn, mlp = ([rows(t) for t in got[k]] for k in ("y", "o", "attn", "mlp"))
    embed = rows(got["embed"])
    at = {p: n for n, p in enumerate(positions)}
    labels: list[QKPart] = [QKPart("embed", None, None)]
    vecs: dict[int, list] = {p: [embed[r]] for p, r in at.items()}
    if fam.pos_embed:
        table = lm.model.get_submodule(fam.pos_embed).weight
        labels.append(QKPart("pos_embed", None, None))
        for p in positions:
            pe = table[p].to(lm.device).double()  # (d,)
            vecs[p] = [vecs[p][0] - pe, pe]
    notes = []
    for n in range(layer):
        _, (W, b) = output_projection(parts.attns[n], fam.w_o)  # in float64: only the model's
        W, b = W.to(lm.device).double(), None if b is None else b.to(lm.device).double()  # own
        split = {p: head_parts(lm, n, y[n][r], None if o[n] is None else o[n][r], (W, b), nh,
                               hd, attn[n][r], dtype) for p, r in at.items()}  # rounding left
        if any(s is None for s in split.values()):
            labels.append(QKPart("attn", n, None))
            for p, r in at.items():
                vecs[p].append(attn[n][r])
            notes.append(HEADS_UNSPLIT(layer=n))
        else:
            labels += [QKPart("attn_head", n, h) for h in range(nh)]
            with_bias = any(s[1] is not None for s in split.values())
            if with_bias:
                labels.append(QKPart("attn_bias", n, None))
            for p in positions:
                heads, bias = split[p]
                vecs[p] += list(heads)
                if with_bias:
                    vecs[p].append(bias)
        labels.append(QKPart("mlp", n, None))
        for p, r in at.items():
            vecs[p].append(mlp[n][r])
    return labels, {p: torch.stack(v) for p, v in vecs.items()}, notes


class QKSide:
    """How one side (the query's or the key's) turns a stream part at one position into its
    contribution to q or k of one head: the norm in front of attention frozen at the stream
    there, the head's rows of W_Q (W_K), the q/k norm frozen at the actual projection, the
    rotation of RoPE at that position; each a linear map."""

    def __init__(self, lm: LoadedModel, layer: int, which: str, head: int) -> None:
        import torch

        fam = lm.parts.family
        info = model_info(lm)
        attn = lm.parts.attns[layer]
        block = lm.parts.blocks[layer]
        self.fam, self.cfg, self.model = fam, lm.config, lm.model
        self.norm = block.get_submodule(fam.attn_norm) if fam.attn_norm else None
        Wq, bq, Wk, bk = fam.qk_weights(attn, info.n_heads, info.n_kv_heads, info.head_dim)
        W, b = (Wq, bq) if which == "q" else (Wk, bk)
        hd = info.head_dim
        self.rows = slice(head * hd, (head + 1) * hd)
        self.qk_norm = getattr(attn, f"{which}_norm", None) if fam.qk_norm else None
        # every head's rows only where one norm spans them all (OLMo 2); else this head's
        whole = self.qk_norm is not None and fam.qk_norm is QkNorm.whole
        if not whole:
            W, b = W[self.rows], None if b is None else b[self.rows]
            self.rows = slice(0, hd)
        self.W = W.detach().to(lm.device).double()  # (hd or heads·hd, d)
        self.b = None if b is None else b.detach().to(lm.device).double()
        self.layer, self.hd = layer, hd
        self.dtype = torch.float64

    def tables(self, T: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.fam.positions is not PositionKind.rope:
            return None
        rot = rotary_dims(self.cfg, self.hd)
        cos, sin, _ = rope_tables(self.cfg, T, rot, self.model, self.W.device, self.layer)
        return cos.double(), sin.double()

    def __call__(self, parts: torch.Tensor, x: torch.Tensor,
                 pos: int | Sequence[int] | torch.Tensor, rope: tuple | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """parts (P, d) of the stream x (d,) at position pos -> their contributions (P, hd) to
        this side's vector, and the side's constant (hd,) or None. With x (P, d) and pos (P,)
        each row is frozen at its own stream (`whole`)."""
        const = None
        if self.norm is not None:
            centre, gain, nb = frozen_norm(self.norm, x, self.fam.norm_type)
            gain = gain.to(self.dtype)
            parts = through_frozen(parts, centre, gain)  # (P, d)
            x = through_frozen(x, centre, gain) + (0 if nb is None else nb.to(self.dtype))
            const = None if nb is None else nb.to(self.dtype)
        W = self.W[self.rows]  # (hd, d)
        b = None if self.b is None else self.b[self.rows]
        out = parts @ W.T  # (P, hd)
        if const is not None:
            const = const @ W.T
        if b is not None:
            const = b if const is None else const + b
        if self.qk_norm is not None:
            if self.fam.qk_norm is QkNorm.whole:  # one RMSNorm over every head's values (OLMo 2)
                actual = x @ self.W.T + (0 if self.b is None else self.b)  # (heads·hd,)
                gain = frozen_norm(self.qk_norm, actual, self.fam.norm_type)[1][..., self.rows]
            else:  # an RMSNorm over each head's values (Qwen3, Gemma 3)
                actual = x @ W.T + (0 if b is None else b)  # (hd,)
                gain = frozen_norm(self.qk_norm, actual, self.fam.norm_type)[1]
            gain = gain.to(self.dtype)
            out = out * gain
            const = None if const is None else const * gain
        if rope is not None:
            cos, sin = rope[0][pos], rope[1][pos]  # (rot,) or (P, rot) each
            out = apply_rope(out, cos, sin)
            if const is not None:  # one constant, rotated at each row's position
                const = apply_rope(const.expand(*cos.shape[:-1], -1), cos, sin)
        return out, const

    def whole(self, x: torch.Tensor, positions: Sequence[int] | torch.Tensor, rope: tuple | None
              ) -> torch.Tensor:
        """This side's vectors (N, hd) of whole streams x (N, d) at those positions: each
        frozen at itself, which is the model's own computation."""
        out, const = self(x, x, positions, rope)
        return out + (0 if const is None else const)


def _split(lm: LoadedModel, info: ModelInfo, T: int, layer: int, head: int, i: int, j: int,
           keep: list[int], got: dict, window: int | None, most: int, top: int) -> ScoreSplit:
    import torch

    fam = lm.parts.family
    rtol = RTOL if info.dtype == "float32" else HALF_RTOL
    kv_head = head // (info.n_heads // info.n_kv_heads)
    scale = attention_scale(lm.config, layer, info.head_dim)
    cap = fam.softcap(lm.config, "attn")
    labels, parts, notes = stream_parts(lm, got, layer, sorted({i, j}), keep, info.dtype)
    stream = got["stream"]  # (i + 1, d)
    checks = [_sums_to_stream(parts, stream, (i, j), layer, rtol)]

    qside, kside = QKSide(lm, layer, "q", head), QKSide(lm, layer, "k", kv_head)
    rope = qside.tables(T)
    q_parts, q_labels = _with_constant(*qside(parts[i], stream[i], i, rope), labels)  # (Pq, hd)
    k_parts, k_labels = _with_constant(*kside(parts[j], stream[j], j, rope), labels)  # (Pk, hd)
    terms = scale * (q_parts @ k_parts.T)  # (Pq, Pk)
    score = float(terms.sum())
    sink = float(lm.parts.attns[layer].get_parameter(fam.attn_sinks)[head]) \
        if fam.attn_sinks else None  # gpt-oss: the head's sink logit joins the softmax
    stream_score, ours, row_checks = _row(qside, kside, stream, i, j, rope, scale, cap, window,
                                          got["weights"], score, info.dtype, sink)
    checks += row_checks
    flat = terms.flatten()  # (Pq·Pk,)
    absolute = float(flat.abs().sum()) or 1.0
    order = flat.abs().topk(min(top, flat.numel())).indices.tolist()
    Pk = terms.shape[1]
    top_terms = tuple(QKTerm(query=q_labels[n // Pk], key=k_labels[n % Pk],
                             value=float(flat[n]), share=float(flat[n]) / absolute)
                      for n in order)
    rows_q, cols_k, grid = _grid(terms, q_labels, k_labels)
    return ScoreSplit(
        layer=layer, head=head, kv_head=kv_head, query=i, key=j, most_attended=most,
        scale=scale, score=score, stream_score=stream_score, softcap=cap,
        capped_score=None if not cap else cap * float(torch.tanh(torch.tensor(score / cap))),
        window=window, weight=float(got["weights"][j]), recomputed_weight=float(ours[j]),
        n_terms=int(flat.numel()), top=top_terms, rest=score - float(flat[order].sum()),
        query_parts=_sides(q_labels, terms.sum(1), q_parts),
        key_parts=_sides(k_labels, terms.sum(0), k_parts),
        grid_rows=rows_q, grid_columns=cols_k, grid=grid, checks=tuple(checks),
        notes=tuple(notes))


def _with_constant(parts: torch.Tensor, const: torch.Tensor | None, labels: list
                   ) -> tuple[torch.Tensor, list]:
    """A side's parts (P, hd) and labels, with its constant as one more part where it has one."""
    import torch

    if const is None:
        return parts, list(labels)
    return torch.cat([parts, const[None]]), [*labels, QKPart("bias", None, None)]


def _sides(labels: list, folded: torch.Tensor, vectors: torch.Tensor) -> tuple[QKPartSum, ...]:
    return tuple(QKPartSum(p, float(v), float(n))
                 for p, v, n in zip(labels, folded, vectors.norm(dim=1), strict=True))


def _row(qside: QKSide, kside: QKSide, stream: torch.Tensor, i: int, j: int, rope: tuple | None,
         scale: float, cap: float | None, window: int | None, theirs: torch.Tensor,
         score: float, dtype: str, sink: float | None = None
         ) -> tuple[float, torch.Tensor, list[Check]]:
    """The same operations on the whole streams: the score of (i, j) (against the sum of the
    terms) and the query's row of weights (against the model's own): (score, weights (i + 1,),
    the two checks)."""
    import torch

    rtol = RTOL if dtype == "float32" else HALF_RTOL
    q = qside.whole(stream[i:i + 1], [i], rope)[0]  # (hd,)
    keys = kside.whole(stream, torch.arange(i + 1, device=stream.device), rope)  # (i + 1, hd)
    row = scale * (keys @ q)  # (i + 1,)
    stream_score = float(row[j])
    bound = max(1.0, scale * float(q.norm() * keys[j].norm()))
    checks = [Check(
        name="the terms sum to the score computed from the whole streams",
        value=abs(score - stream_score), tolerance=f"≤ {rtol:g}·max(1, scale·|q|·|k|) = "
        f"{rtol * bound:.3g}", ok=abs(score - stream_score) <= rtol * bound, target="qk_score")]
    if cap:
        row = cap * torch.tanh(row / cap)
    if window:
        distance = i - torch.arange(i + 1, device=row.device)  # (i + 1,)
        row = row.masked_fill(distance >= window, float("-inf"))
    if sink is None:
        ours = torch.softmax(row, dim=-1)
    else:  # the sink's logit takes part in the softmax, its column is dropped
        ours = torch.softmax(torch.cat([row, row.new_tensor([sink])]), dim=-1)[:-1]
    gap = float((ours - theirs).abs().max())
    wtol = 1e-4 if dtype == "float32" else HALF_RTOL
    checks.append(Check(
        name=f"the weights of query {i} recomputed that way = the model's (max |Δ| over the "
        "row)", value=gap, tolerance=f"≤ {wtol:g}", ok=gap <= wtol, target="qk_weights"))
    return stream_score, ours, checks


def _sums_to_stream(parts: dict, stream: torch.Tensor, positions: tuple[int, int], layer: int,
                    rtol: float) -> Check:
    """The parts at each position sum to the stream the model had entering block `layer`."""
    gap, bound = 0.0, 0.0
    for p in set(positions):
        gap = max(gap, float((parts[p].sum(dim=0) - stream[p]).abs().max()))
        bound = max(bound, rtol * max(1.0, float(stream[p].abs().max())))
    where = " and ".join(str(p) for p in sorted(set(positions)))
    return Check(name=f"the parts at position{'s' if len(set(positions)) > 1 else ''} {where} "
                 f"sum to the stream entering block {layer} (max |Δ|)", value=gap,
                 tolerance=f"≤ {bound:.3g}", ok=gap <= bound, target="qk_stream")


def _grid(terms: torch.Tensor, q_labels: list, k_labels: list) -> tuple[tuple, tuple, tuple]:
    """The terms summed into the GRID query parts × the GRID key parts of largest |value|, and
    a `rest` row and column for the others; the cells sum to the score."""
    import torch

    def groups(folded: torch.Tensor) -> tuple[list[int], torch.Tensor]:
        """The parts shown (in stream order) and a (groups, parts) 0/1 matrix: one row per part
        shown, then one for the others when there are any."""
        shown = sorted(folded.abs().topk(min(GRID, folded.numel())).indices.tolist())
        n = folded.numel()
        member = torch.zeros(len(shown) + (n > len(shown)), n, dtype=terms.dtype,
                             device=terms.device)
        if n > len(shown):
            member[-1] = 1
        for g, part in enumerate(shown):
            member[g, part] = 1
            if n > len(shown):
                member[-1, part] = 0
        return shown, member

    qs, rows = groups(terms.sum(1))
    ks, cols = groups(terms.sum(0))
    grid = rows @ terms @ cols.T  # (rows, columns)
    rest = QKPart("rest", None, None)
    return (tuple(q_labels[n] for n in qs) + ((rest,) if rows.shape[0] > len(qs) else ()),
            tuple(k_labels[n] for n in ks) + ((rest,) if cols.shape[0] > len(ks) else ()),
            tuple(tuple(float(v) for v in r) for r in grid.tolist()))


__all__ = ["GRID", "KEEP_BYTES", "QKSide", "ScoreSplit", "kept_bytes", "qk_forward",
           "split_score", "stream_parts", "visible_key"]
