"""The patterns a head's attention is scored against (docs/heads.md): the keys each pattern
names for each query, the running sums of the attention on them, the induction sequences of
seeded random tokens repeated once, and the loss on their repeated half."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fptrace.addresses import Head
from fptrace.core.trace import model_info
from fptrace.errors import BadInput, param
from fptrace.models.loading import LoadedModel

if TYPE_CHECKING:
    import torch

EVIDENCE = 24  # (query, key) pairs of the --head head listed, the strongest
LOSS_POSITIONS = 4096  # positions a product with the LM head takes (repeated_losses) ...
LOSS_VOCAB = 1024  # ... and its vocabulary rows


@dataclass(frozen=True)
class Item:
    """One prompt to score: its name, its token ids, its subject's positions (or None)."""

    name: str
    ids: tuple[int, ...]
    subject: tuple[int, ...] | None = None


@dataclass
class Tally:
    """Running sums of the pattern scores, (L, H) each, added block by block, and the evidence
    of one head."""

    L: int
    H: int
    sums: dict = field(default_factory=dict)  # score -> (L, H) float64 tensor
    counts: dict = field(default_factory=dict)  # score -> (L,) queries counted, by block
    evidence: list = field(default_factory=list)

    def add(self, score: str, first: int, total: Any, n: int) -> None:
        """Blocks first … first + l − 1's sums over `n` queries (total: (l, H)) added to
        `score`'s."""
        import torch

        if n == 0:
            return
        if score not in self.sums:
            self.sums[score] = torch.zeros(self.L, self.H, dtype=torch.float64)
            self.counts[score] = torch.zeros(self.L, dtype=torch.float64)
        self.sums[score][first:first + len(total)] += total.double().cpu()
        self.counts[score][first:first + len(total)] += n

    def mean(self, score: str) -> Any:
        """(L, H) float64: the sums over the queries counted; None where none was."""
        if score not in self.counts:
            return None
        return self.sums[score] / self.counts[score][:, None]


def check_induction(lm: LoadedModel, n: int, length: int) -> None:
    """Refuse n sequences of `length` tokens repeated once that the model cannot take."""
    if n < 0 or length < 0:
        raise BadInput(f"{param('induction')} must be N×LEN with N ≥ 0 and LEN ≥ 2")
    if n == 0:
        return
    if length < 2:
        raise BadInput(f"{param('induction')} length {length}: a copy needs 2 tokens or more")
    ctx = model_info(lm).context_length
    if ctx and 2 * length > ctx:
        raise BadInput(f"{param('induction')} length {length}: the repeated sequence is "
                       f"{2 * length} "
                       f"tokens, beyond {lm.name}'s context of {ctx}; use {ctx // 2} or less")


def induction_items(lm: LoadedModel, n: int, length: int, seed: int) -> list[Item]:
    """n sequences of `length` seeded random token ids, each repeated once (2·length tokens)."""
    import torch

    check_induction(lm, n, length)
    if n == 0:
        return []
    g = torch.Generator().manual_seed(seed)
    V = int(lm.config.vocab_size)
    out = []
    for k in range(n):
        r = torch.randint(0, V, (length,), generator=g).tolist()
        out.append(Item(f"induction[{k}]", tuple(r + r)))
    return out


def pattern_masks(ids: Sequence[int], induction_half: int | None = None) -> dict[str, Any]:
    """(T, T) float masks of the keys each pattern names for each query (query rows), by
    score; position 0 is never a key of these patterns."""
    import torch

    T = len(ids)
    t = torch.tensor(list(ids))
    out = {}
    prev = torch.zeros(T, T)
    if T >= 3:
        i = torch.arange(2, T)
        prev[i, i - 1] = 1.0
    out["previous"] = prev
    same = (t[:, None] == t[None, :]).float().tril(-1)
    same[:, 0] = 0.0
    out["duplicate"] = same
    if induction_half is not None:
        n = induction_half
        ind = torch.zeros(T, T)
        i = torch.arange(n, 2 * n)
        ind[i, i - n + 1] = 1.0
        out["induction"] = ind
    return out


def tally(sums: Tally, first: int, A: Any, item: Item, masks: dict, focus: Head | None
          ) -> None:
    """Add one prompt's attention at blocks first … first + l − 1 (A: (l, H, T, T), their
    weights) to the sums: per score, Σ over queries with a key of the attention on those
    keys."""
    T = A.shape[-1]
    for score, m in masks.items():
        rows = m.sum(-1) > 0  # (T,) the queries that have a key
        n = int(rows.sum())
        if n:
            got = (A * m.to(A.device)).sum(-1)  # (l, H, T)
            sums.add(score, first, got[..., rows.to(A.device)].sum(-1), n)
    if T >= 2:
        sums.add("first", first, A[..., 1:, 0].sum(-1), T - 1)
    if item.subject:
        sums.add("subject", first, A[..., -1, list(item.subject)].sum(-1), 1)
    if focus is not None and first <= focus.layer < first + len(A):
        w = A[focus.layer - first, focus.head]
        for score, m in masks.items():
            q, k = m.nonzero(as_tuple=True)
            got = w[q, k]
            if len(got) > EVIDENCE:  # the EVIDENCE strongest and their ties: what a sort of all
                # of them would keep (a long prompt's duplicates are millions of pairs)
                keep = got >= got.topk(EVIDENCE).values[-1]
                q, k, got = q[keep], k[keep], got[keep]
            for a, b, v in zip(q.tolist(), k.tolist(), got.tolist(), strict=True):
                sums.evidence.append((score, v, item.name, a, b, item.ids[a], item.ids[b]))


def repeated_losses(lm: LoadedModel, stream: Any, rows: Sequence[Sequence[int]], n: int
                    ) -> list[float]:
    """Each row's mean cross-entropy of the predictions of the second copy's tokens 1 … n − 1
    (each predicted at the position before it), in nats, from the final norm's input `stream`
    (B, n − 1, d) at the n − 1 positions n … 2n − 2 whose prediction the loss reads (rows: the
    whole sequences). The final projection (final norm, LM head, any final softcap) is taken
    there only, LOSS_POSITIONS a product; where the LM head is a plain Linear, LOSS_VOCAB of its
    rows at a time, each position's log-sum-exp gathered over them (the (positions, V) logits
    are never held whole: reading them back from memory took about half as long as the
    product). A position's loss is the log-sum-exp of its logits minus its target's logit
    (float32), a row's the mean over its n − 1 positions."""
    import torch

    B, d = len(rows), stream.shape[-1]
    targets = torch.tensor([list(ids[n + 1:2 * n]) for ids in rows], device=stream.device)
    head = lm.parts.lm_head
    plain = type(head) is torch.nn.Linear
    cap = lm.parts.final_softcap
    losses = []
    with torch.inference_mode():
        normed = lm.parts.final_norm(stream).reshape(-1, d)  # (B·(n − 1), d)
        flat = targets.reshape(-1)
        V = int(head.weight.shape[0]) if plain else 0
        for start in range(0, len(flat), LOSS_POSITIONS):
            x, t = normed[start:start + LOSS_POSITIONS], flat[start:start + LOSS_POSITIONS]
            if not plain:
                logits = lm.parts.head(x).float()  # (m, V)
                lse = torch.logsumexp(logits, -1)
                mine = logits.gather(1, t[:, None])[:, 0]
            else:
                parts, mine = [], torch.zeros(len(t), device=x.device)
                for v in range(0, V, LOSS_VOCAB):
                    bias = None if head.bias is None else head.bias[v:v + LOSS_VOCAB]
                    lg = torch.nn.functional.linear(x, head.weight[v:v + LOSS_VOCAB], bias)
                    if cap:
                        lg = torch.tanh(lg / cap) * cap
                    lg = lg.float()  # (m, LOSS_VOCAB)
                    here = (t >= v) & (t < v + lg.shape[1])
                    mine[here] = lg[here, t[here] - v]
                    parts.append(_logsumexp_(lg))
                lse = torch.logsumexp(torch.stack(parts, -1), -1)
            losses.append(lse - mine)
    per_row = torch.cat(losses).view(B, n - 1).mean(-1)
    return [float(x) for x in per_row]


def _logsumexp_(x: torch.Tensor) -> torch.Tensor:
    """torch.logsumexp(x, -1) computed in x's own memory (x is spoiled): the same steps (the
    row's maximum subtracted, an infinite maximum taken as 0), one (m, LOSS_VOCAB) buffer fewer
    written and read a tile."""
    top = x.amax(-1, keepdim=True)
    top.masked_fill_(top.abs() == float("inf"), 0.0)
    return x.sub_(top).exp_().sum(-1).log_().add_(top[:, 0])


__all__ = ["EVIDENCE", "Item", "Tally", "check_induction", "induction_items", "pattern_masks",
           "repeated_losses", "tally"]
