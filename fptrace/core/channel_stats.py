"""Per-channel running statistics of one activation site, mergeable across shards.

A ChannelStats is fed (N, d) batches of token positions (of one prompt, or of several: a padded
forward pass's real rows) and keeps, per channel: mean and M2 (batched Welford: each batch's own
mean and M2, combined with the running ones by Chan et al.'s parallel formula), the largest |x|
with where it occurred (prompt, position, and the token there when the caller gives tokens) and
its signed value, and a histogram of |x|. Memory is O(d · bins) whatever the number
of prompts; merge() of any split of the prompts, in any order, gives what one pass gives: count,
maxima, their locations and the histograms exactly, mean and variance to float64 rounding
(relative ~1e-15 · |mean| / std).

Conventions:
- bins: edges e_0 = 0 < e_1 < … < e_m = inf; bin i counts e_i <= |x| < e_(i+1), as
  np.digitize(|x|, edges) - 1 would. Default DEFAULT_BINS: one per decade from 1e-3 to 1e4.
- var and std are the population ones (M2 / count); the sample variance is var·count/(count-1).
- the location of a channel's max is the smallest (prompt, position) among equal |x| (then the
  positive value, should one (prompt, position) be fed twice with both signs): a total order, so
  no split or merge order changes it. In one pass in prompt and position order it is the first seen.
- prompt ids are ints; merge_(other, prompt_offset=k) adds k to other's, so that shards numbered
  from 0 each merge, in order, into what one pass numbering them all would give.
- empty (count 0): mean 0, var and std nan, absmax -1, prompt, position and token -1; token is
  also -1 where the batch gave no tokens.
- to_dict(): lists of plain floats and ints, with M2 rather than the variance, so that the state
  round-trips bit-exactly through json (Python writes a float as its shortest round-tripping
  repr); the last bin edge, inf, which JSON cannot write, is the string "inf".
- NaN or Inf in a batch raises NonFiniteValues and leaves the accumulator unchanged.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from fptrace.errors import BadInput, NonFiniteValues

if TYPE_CHECKING:
    import numpy as np
    import torch

# |x| bins: [0, 1e-3), [1e-3, 1e-2), …, [1e3, 1e4), [1e4, inf)
DEFAULT_BINS: tuple[float, ...] = (0.0, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1e3, 1e4, math.inf)

_BLOCK = 16  # rows per block when locating each channel's max (see _locate_max)
_COLS = 64  # channels per block when an edge is straddled by few channels (see _histogram)
_FIELDS = ("mean", "m2", "absmax", "absmax_value", "argmax_prompt", "argmax_position",
           "argmax_token", "hist")
_ARRAYS = ("_mean", "_m2", "_absmax", "_value", "_prompt", "_position", "_token", "_hist")


class ChannelStats:
    """Running per-channel statistics of a (d,)-wide activation site (see the module docstring)."""

    __slots__ = ("_absmax", "_hist", "_m2", "_mean", "_position", "_prompt", "_token", "_value",
                 "bins", "count", "width")

    def __init__(self, width: int, bins: Sequence[float] = DEFAULT_BINS) -> None:
        import numpy as np

        self.width = _check_width(width)
        self.bins = _check_bins(bins)
        self.count = 0
        d = self.width
        self._mean = np.zeros(d)
        self._m2 = np.zeros(d)
        self._absmax = np.full(d, -1.0)
        self._value = np.zeros(d)
        self._prompt = np.full(d, -1, dtype=np.int64)
        self._position = np.full(d, -1, dtype=np.int64)
        self._token = np.full(d, -1, dtype=np.int64)
        self._hist = np.zeros((d, len(self.bins) - 1), dtype=np.int64)

    # ---- feeding and merging ---------------------------------------------------------------

    def update(self, x: torch.Tensor, prompt: Any, positions: Any, tokens: Any = None) -> None:
        """Add N token positions: x (N, d) float tensor; prompt one int id for every row, or N
        of them; positions N ints, distinct within a prompt; tokens (optional) the N token ids,
        kept beside each channel's max."""
        batch = _of_batch(x, prompt, positions, tokens, self.bins, self.width, self._absmax)
        if batch is not None:
            self.merge_(batch)

    @classmethod
    def of_batch(cls, x: torch.Tensor, prompt: Any, positions: Any, tokens: Any = None,
                 bins: Sequence[float] = DEFAULT_BINS) -> ChannelStats:
        """The statistics of one batch on its own (arguments as for update): what update
        merges in. With columns(), one call can serve several sites side by side."""
        if not hasattr(x, "shape") or len(x.shape) != 2:
            shape = tuple(x.shape) if hasattr(x, "shape") else type(x).__name__
            raise BadInput(f"channel stats: expected an (N, d) tensor, got {shape}")
        width = _check_width(int(x.shape[1]))
        batch = _of_batch(x, prompt, positions, tokens, _check_bins(bins), width, None)
        return batch if batch is not None else cls(width, bins)

    def columns(self, start: int, stop: int) -> ChannelStats:
        """A copy of channels start..stop-1 (the same count and bins)."""
        if not 0 <= start < stop <= self.width:
            raise BadInput(f"channel stats: columns {start}..{stop} of width {self.width}")
        out = ChannelStats(stop - start, self.bins)
        out.count = self.count
        for name in _ARRAYS:
            setattr(out, name, getattr(self, name)[start:stop].copy())
        return out

    def merge_(self, other: ChannelStats, prompt_offset: int = 0) -> ChannelStats:
        """Fold other into self (Chan's formula, sums, the larger max), other's prompt ids
        shifted by prompt_offset; returns self."""
        import numpy as np

        self._check_compatible(other)
        if other.count == 0:
            return self
        if prompt_offset:
            other = other.copy()
            other._prompt = np.where(other._prompt >= 0, other._prompt + prompt_offset, -1)
        if self.count == 0:
            self._assign(other)
            return self
        na, nb = self.count, other.count
        n = na + nb
        delta = other._mean - self._mean  # (d,)
        self._mean = (na * self._mean + nb * other._mean) / n  # symmetric: merge order is moot
        self._m2 = self._m2 + other._m2 + delta * delta * (na * nb / n)
        self.count = n
        self._hist = self._hist + other._hist
        take = _beats(other, self)  # (d,) bool
        self._absmax = np.where(take, other._absmax, self._absmax)
        self._value = np.where(take, other._value, self._value)
        self._prompt = np.where(take, other._prompt, self._prompt)
        self._position = np.where(take, other._position, self._position)
        self._token = np.where(take, other._token, self._token)
        return self

    def merge(self, other: ChannelStats, prompt_offset: int = 0) -> ChannelStats:
        """A new ChannelStats holding both (neither operand changes)."""
        return self.copy().merge_(other, prompt_offset)

    def copy(self) -> ChannelStats:
        out = ChannelStats(self.width, self.bins)
        out._assign(self)
        return out

    # ---- results ----------------------------------------------------------------------------

    @property
    def mean(self) -> np.ndarray:
        """(d,) float64."""
        return self._mean.copy()

    @property
    def var(self) -> np.ndarray:
        """(d,) float64 population variance M2 / count (nan while empty)."""
        import numpy as np

        if self.count == 0:
            return np.full(self.width, np.nan)
        return self._m2 / self.count

    @property
    def std(self) -> np.ndarray:
        """(d,) float64 population standard deviation."""
        import numpy as np

        return np.sqrt(self.var)

    @property
    def m2(self) -> np.ndarray:
        """(d,) float64 sum of squared deviations from the mean."""
        return self._m2.copy()

    @property
    def absmax(self) -> np.ndarray:
        """(d,) float64 largest |x| (-1 while empty)."""
        return self._absmax.copy()

    @property
    def absmax_value(self) -> np.ndarray:
        """(d,) float64 the signed value whose |x| is absmax."""
        return self._value.copy()

    @property
    def argmax_prompt(self) -> np.ndarray:
        """(d,) int64 prompt id of absmax (-1 while empty)."""
        return self._prompt.copy()

    @property
    def argmax_position(self) -> np.ndarray:
        """(d,) int64 position of absmax within its prompt (-1 while empty)."""
        return self._position.copy()

    @property
    def argmax_token(self) -> np.ndarray:
        """(d,) int64 token id at absmax (-1 while empty, or where no tokens were given)."""
        return self._token.copy()

    @property
    def hist(self) -> np.ndarray:
        """(d, n_bins) int64 counts of |x| per bin; every row sums to count."""
        return self._hist.copy()

    # ---- JSON -------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """Plain lists of floats and ints; json round-trips it bit-exactly (inf edge as "inf")."""
        return {"width": self.width, "bins": [_edge_out(e) for e in self.bins],
                "count": self.count, "mean": self._mean.tolist(), "m2": self._m2.tolist(),
                "absmax": self._absmax.tolist(), "absmax_value": self._value.tolist(),
                "argmax_prompt": self._prompt.tolist(),
                "argmax_position": self._position.tolist(),
                "argmax_token": self._token.tolist(), "hist": self._hist.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> ChannelStats:
        """The inverse of to_dict; BadInput (one line) for a dict that is not one."""
        import numpy as np

        if not isinstance(d, dict):
            raise BadInput(f"channel stats: expected a dict, got {type(d).__name__}")
        missing = [k for k in ("width", "bins", "count", *_FIELDS) if k not in d]
        if missing:
            raise BadInput(f"channel stats: missing {', '.join(missing)}")
        out = cls(d["width"], [_edge_in(e) for e in _as_list(d["bins"], "bins")])
        out.count = _check_index(d["count"], "count")
        w, nb = out.width, len(out.bins) - 1
        out._mean = _array(d["mean"], "mean", np.float64, (w,))
        out._m2 = _array(d["m2"], "m2", np.float64, (w,))
        out._absmax = _array(d["absmax"], "absmax", np.float64, (w,))
        out._value = _array(d["absmax_value"], "absmax_value", np.float64, (w,))
        out._prompt = _array(d["argmax_prompt"], "argmax_prompt", np.int64, (w,))
        out._position = _array(d["argmax_position"], "argmax_position", np.int64, (w,))
        out._token = _array(d["argmax_token"], "argmax_token", np.int64, (w,))
        out._hist = _array(d["hist"], "hist", np.int64, (w, nb))
        _check_state(out)
        return out

    # ---- internals --------------------------------------------------------------------------

    def _assign(self, other: ChannelStats) -> None:
        self.count = other.count
        for name in _ARRAYS:
            setattr(self, name, getattr(other, name).copy())

    def _check_compatible(self, other: ChannelStats) -> None:
        if not isinstance(other, ChannelStats):
            raise BadInput(f"channel stats: cannot merge a {type(other).__name__}")
        if other.width != self.width:
            raise BadInput(f"channel stats: cannot merge width {other.width} into width "
                           f"{self.width}")
        if other.bins != self.bins:
            raise BadInput(f"channel stats: cannot merge different bin edges "
                           f"{_edges_text(other.bins)} into {_edges_text(self.bins)}")

    def __repr__(self) -> str:
        return f"ChannelStats(width={self.width}, count={self.count}, bins={len(self.bins) - 1})"


# ---- one batch ------------------------------------------------------------------------------

def _of_batch(x: torch.Tensor, prompt: Any, positions: Any, tokens: Any,
              bins: tuple[float, ...], width: int, floor: np.ndarray | None
              ) -> ChannelStats | None:
    """Check a batch, put its rows in (prompt, position) order and compute its statistics
    (None when it has no rows)."""
    import numpy as np
    import torch

    pos = _check_positions(positions, x, width)
    prompts = _check_prompts(prompt, len(pos))  # (N,)
    toks = np.full(len(pos), -1, dtype=np.int64) if tokens is None else \
        _check_rows(tokens, len(pos), "tokens")
    if pos.size == 0:
        return None
    x = x.detach().contiguous()  # (N, d)
    p, q = prompts[1:], prompts[:-1]
    if not ((p > q) | ((p == q) & (pos[1:] > pos[:-1]))).all():  # rows in (prompt, position)
        order = np.lexsort((pos, prompts))  # order: the first holding a max is the smallest
        pos, prompts, toks = pos[order], prompts[order], toks[order]
        same = (prompts[1:] == prompts[:-1]) & (pos[1:] == pos[:-1])
        if same.any():
            raise BadInput(f"channel stats: prompt {prompts[1:][same][0]} repeats a position")
        x = x[torch.as_tensor(order, device=x.device)]  # (N, d)
    if floor is None:
        floor = np.full(width, -1.0)
    return _batch_stats(x, prompts, pos, toks, bins, floor)


def _batch_stats(x: torch.Tensor, prompts: np.ndarray, pos: np.ndarray, toks: np.ndarray,
                 bins: tuple[float, ...], floor: np.ndarray) -> ChannelStats:
    """The statistics of one batch (N >= 1 rows in increasing (prompt, position) order) on its
    own, except that a channel's max below floor (the running absmax, (d,)) is left unseen: it
    would lose."""
    import torch

    n, d = x.shape
    # one (N, d) float64 workspace, reused below for |x| and the histogram's scratch: a batch
    # then frees one block, which the allocator keeps for the next (many freed blocks, it gives
    # back to the OS and faults in again: twice the time)
    two = 2 if x.dtype == torch.float64 else 1  # float64: |x| and the scratch need 8 bytes each
    ws = torch.empty((two, n, d), dtype=torch.float64, device=x.device)  # (1 or 2, N, d)
    y = ws[0].copy_(x)  # (N, d)
    shift = y[0].clone()  # (d,) K = the first row: sum (x-K)^2 <= (n+1)·M2, little cancellation
    s = y.sub_(shift).sum(0)  # (d,) sum (x - K)
    q = y.mul_(y).sum(0)  # (d,) sum (x - K)^2: NaN or Inf anywhere in x makes it non-finite
    if not math.isfinite(float(q.sum())):
        _non_finite(q, prompts)
    a, scratch = _abs_into(x, ws)  # (N, d) |x| in float32 (float64 for float64 x), (N, d) int
    amax, cols, row = _locate_max(a, torch.as_tensor(floor, device=a.device))  # (d,), (k,), (k,)
    out = ChannelStats(d, bins)
    out.count = n
    out._mean = (shift + s / n).cpu().numpy()
    out._m2 = (q - s * s / n).clamp_(min=0.0).cpu().numpy()
    c = cols.cpu().numpy()
    out._absmax[c] = amax[cols].double().cpu().numpy()
    out._value[c] = x.view(-1)[row * d + cols].double().cpu().numpy()  # (k,) signed
    r = row.cpu().numpy()
    out._prompt[c] = prompts[r]
    out._position[c] = pos[r]
    out._token[c] = toks[r]
    out._hist = _histogram(a, amax, bins, scratch).cpu().numpy()
    return out


def _abs_into(x: torch.Tensor, ws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """|x| (N, d) exactly, in float32 (float64 for a float64 x), and an (N, d) int scratch of
    the same width, both in the storage of ws, the (1 or 2, N, d) float64 workspace."""
    import torch

    n, d = x.shape
    if x.dtype == torch.float64:
        return torch.abs(x, out=ws[0]), ws[1].view(torch.int64)
    half = ws.view(-1).view(torch.float32)  # (2 N d,)
    a = half[: n * d].view(n, d)  # (N, d)
    if x.dtype == torch.float32:
        torch.abs(x, out=a)
    else:
        a.copy_(x).abs_()  # 16-bit floats widen exactly
    return a, half[n * d:].view(n, d).view(torch.int32)


def _non_finite(q: torch.Tensor, prompts: np.ndarray) -> None:
    import torch

    bad = (~torch.isfinite(q)).nonzero()[:, 0].tolist()  # (k,)
    where = f" in {len(bad)} channel(s), first {bad[0]}" if bad else ""
    ids = sorted(set(prompts.tolist()))
    who = f"prompt {ids[0]}" if len(ids) == 1 else f"one of prompts {ids[0]}..{ids[-1]}"
    raise NonFiniteValues(f"channel stats: {who} has NaN or Inf (or values too large "
                          f"for float64){where}")


def _locate_max(a: torch.Tensor, floor: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """a (N, d) >= 0 -> (the max of each channel (d,), the channels whose max is >= floor (k,),
    the first row holding the max of each of them (k,)).

    torch's argmax(0) costs ~2 ms at (512, 1536); this takes the max of each block of _BLOCK
    rows, the first block holding the channel's max, then the first row of that block (~0.5 ms
    when every channel is a candidate, as on a first update; little once the running max is
    high)."""
    import torch

    n, d = a.shape
    b = _BLOCK
    nb, tail = divmod(n, b)
    parts = [a[: nb * b].view(nb, b, d).amax(1)] if nb else []  # (nb, d)
    if tail:
        parts.append(a[nb * b:].amax(0, keepdim=True))  # (1, d)
    bmax = parts[0] if len(parts) == 1 else torch.cat(parts)  # (blocks, d)
    amax = bmax.amax(0)  # (d,)
    cols = (amax.double() >= floor).nonzero()[:, 0]  # (k,) may beat or tie the running max
    if cols.numel() == 0:
        return amax, cols, cols
    target = amax[cols]  # (k,)
    blk = _first_true(bmax[:, cols] == target)  # (k,) first block holding the max
    rows = blk * b + torch.arange(b, device=a.device)[:, None]  # (b, k) the rows of that block
    rows = rows.clamp_(max=n - 1)  # the tail block repeats its last row: after the real one
    j = _first_true(a.view(-1)[rows * d + cols] == target)  # (k,)
    return amax, cols, blk * b + j


def _first_true(mask: torch.Tensor) -> torch.Tensor:
    """mask (m, d) bool, a True in every column -> (d,) int64 index of each column's first True."""
    import torch

    m = mask.shape[0]
    idx = torch.arange(m, device=mask.device)[:, None]  # (m, 1)
    return torch.where(mask, idx, m).amin(0)


def _histogram(a: torch.Tensor, amax: torch.Tensor, bins: tuple[float, ...],
               scratch: torch.Tensor) -> torch.Tensor:
    """a (N, d) = |x| (float32 or float64) -> (d, n_bins) int64 counts per bin; scratch: an
    (N, d) int tensor of a's width.

    For each inner edge e, how many |x| < e per channel, on the float's bits (for x >= 0 the
    order of the floats is that of their bits): (bits - bits(e')).clamp(-1, 0).sum(0), with e'
    the smallest float of a's dtype >= e, so |x| < e' exactly when |x| < e. Only channels that
    straddle e' (min < e' <= max) need it: none, no pass; few (an outlier channel's high edge),
    only their blocks of _COLS channels. At (512, 1536) a pass costs ~0.3 ms; bucketize +
    bincount would cost ~8 ms."""
    import torch

    n, d = a.shape
    ths = _thresholds(bins, a.dtype == torch.float64)
    ibits = a.view(torch.int64 if a.dtype == torch.float64 else torch.int32)  # (N, d)
    t = torch.tensor([e for e, _ in ths], dtype=a.dtype, device=a.device)[:, None]  # (m, 1)
    over = amax >= t  # (m, d) some |x| >= e'
    below = torch.where(over, 0, n)  # (m, d) int64: right unless the channel straddles e'
    c = _COLS if d % _COLS == 0 else d
    blocks = (over & (a.amin(0) < t)).view(len(ths), d // c, c).any(2)  # (m, d/c) straddling
    for k, nb in enumerate(blocks.sum(1).tolist()):
        tb = ths[k][1]
        if 2 * nb > d // c:
            below[k] = _count_below(ibits, tb, scratch)  # (d,)
        elif nb:
            cols = blocks[k].nonzero()[:, 0]  # (nb,)
            below[k].view(-1, c)[cols] = _count_below_in(ibits, tb, cols, c, scratch)  # (nb, c)
    zero = torch.zeros(1, d, dtype=torch.int64, device=a.device)  # |x| < 0
    every = torch.full((1, d), n, dtype=torch.int64, device=a.device)  # |x| < inf
    return torch.cat([zero, below, every]).diff(dim=0).T.contiguous()  # (d, n_bins)


def _count_below(ibits: torch.Tensor, tb: int, buf: torch.Tensor) -> torch.Tensor:
    """ibits (N, d) bits of floats >= 0 -> (d,) how many are < the float of bits tb (buf: an
    (N, d) scratch)."""
    import torch

    torch.sub(ibits, tb, out=buf)  # (N, d)
    buf.clamp_(-1, 0)  # -1 where below, else 0
    return buf.sum(0, dtype=buf.dtype).neg_()  # (d,)


def _count_below_in(ibits: torch.Tensor, tb: int, cols: torch.Tensor, c: int,
                    buf: torch.Tensor) -> torch.Tensor:
    """_count_below on the blocks cols of c channels only -> (len(cols), c)."""
    import torch

    n, d = ibits.shape
    sub = buf.view(-1)[: n * len(cols) * c].view(n, len(cols), c)  # (N, nb, c)
    torch.index_select(ibits.view(n, d // c, c), 1, cols, out=sub)
    sub.sub_(tb).clamp_(-1, 0)  # -1 where below, else 0
    return sub.sum(0, dtype=sub.dtype).neg_().long()  # (nb, c)


@functools.lru_cache(maxsize=64)
def _thresholds(bins: tuple[float, ...], is64: bool) -> tuple[tuple[float, int], ...]:
    """The inner edges as (e', bits of e'): e' = the smallest float64 (is64) or float32 >= e."""
    import numpy as np

    ft, it = (np.float64, np.int64) if is64 else (np.float32, np.int32)
    out = []
    for e in bins[1:-1]:
        with np.errstate(over="ignore"):
            t = ft(e)
        if float(t) < e:
            t = np.nextafter(t, ft(np.inf))
        out.append((float(t), int(np.array(t, dtype=ft).view(it))))
    return tuple(out)


def _beats(b: ChannelStats, a: ChannelStats) -> np.ndarray:
    """(d,) bool: b's max wins over a's: larger |x|, then smaller (prompt, position), then +."""
    pb, pa = b._prompt, a._prompt
    qb, qa = b._position, a._position
    earlier = (pb < pa) | ((pb == pa) & ((qb < qa) | ((qb == qa) & (b._value > a._value))))
    return (b._absmax > a._absmax) | ((b._absmax == a._absmax) & earlier)


# ---- checks ---------------------------------------------------------------------------------

def _check_width(width: Any) -> int:
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise BadInput(f"channel stats: width must be a positive int, got {width!r}")
    return width


def _check_bins(bins: Any) -> tuple[float, ...]:
    try:
        edges = tuple(float(e) for e in bins)
    except (TypeError, ValueError):
        raise BadInput(f"channel stats: bin edges must be numbers, got {bins!r}") from None
    ok = (len(edges) >= 2 and edges[0] == 0.0 and edges[-1] == math.inf
          and all(math.isfinite(e) for e in edges[1:-1])
          and all(lo < hi for lo, hi in pairwise(edges)))
    if not ok:
        raise BadInput(f"channel stats: bin edges must rise strictly from 0 to inf, got "
                       f"{_edges_text(edges)}")
    return tuple(0.0 if e == 0 else e for e in edges)  # -0.0 -> 0.0


def _check_index(v: Any, what: str) -> int:
    if isinstance(v, bool):
        raise BadInput(f"channel stats: {what} must be an int >= 0, got {v!r}")
    try:
        i = operator.index(v)
    except TypeError:
        raise BadInput(f"channel stats: {what} must be an int >= 0, got {v!r}") from None
    if i < 0:
        raise BadInput(f"channel stats: {what} must be an int >= 0, got {i}")
    return i


def _check_prompts(prompt: Any, n: int) -> Any:
    """One prompt id for every row, or n of them: (n,) int64 numpy, each >= 0."""
    import numpy as np

    if isinstance(prompt, (int, np.integer)) and not isinstance(prompt, bool):
        return np.full(n, _check_index(prompt, "prompt id"), dtype=np.int64)
    p = _check_rows(prompt, n, "prompt ids")
    if p.size and p.min() < 0:
        raise BadInput("channel stats: prompt ids must be ints >= 0")
    return p


def _check_rows(v: Any, n: int, what: str) -> Any:
    """(n,) int64 numpy of a list, array or tensor of n ints."""
    import numpy as np
    import torch

    if isinstance(v, bool):
        raise BadInput(f"channel stats: {what} must be ints, got {v!r}")
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu().numpy()
    arr = np.asarray(v)
    if arr.ndim != 1 or arr.shape[0] != n or (arr.size and arr.dtype.kind not in "iu"):
        raise BadInput(f"channel stats: {n} rows but {what} of shape {arr.shape} "
                       f"({arr.dtype})")
    return arr.astype(np.int64, copy=False)


def _check_positions(positions: Any, x: Any, width: int) -> Any:
    """The (N,) int64 numpy positions, after checking x is (N, width) float."""
    import numpy as np
    import torch

    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != width:
        shape = tuple(x.shape) if hasattr(x, "shape") else type(x).__name__
        raise BadInput(f"channel stats: expected an (N, {width}) tensor, got {shape}")
    if not x.is_floating_point():
        raise BadInput(f"channel stats: expected a float tensor, got {x.dtype}")
    if isinstance(positions, torch.Tensor):
        positions = positions.detach().cpu().numpy()
    pos = np.asarray(positions)
    if pos.ndim != 1 or pos.shape[0] != x.shape[0]:
        raise BadInput(f"channel stats: {x.shape[0]} rows but positions of shape {pos.shape}")
    if pos.size and (pos.dtype.kind not in "iu" or pos.min() < 0):
        raise BadInput("channel stats: positions must be ints >= 0")
    return pos.astype(np.int64, copy=False)


def _check_state(s: ChannelStats) -> None:
    """A from_dict result that could not come from to_dict: BadInput."""
    import numpy as np

    if not (np.isfinite(s._mean).all() and np.isfinite(s._m2).all() and (s._m2 >= 0).all()):
        raise BadInput("channel stats: mean and m2 must be finite, m2 >= 0")
    if (s._hist < 0).any() or (s._hist.sum(1) != s.count).any():
        raise BadInput(f"channel stats: every histogram row must sum to count {s.count}")
    seen = s._absmax >= 0
    if s.count and not (seen.all() and (np.abs(s._value) == s._absmax).all()
                        and (s._prompt >= 0).all() and (s._position >= 0).all()
                        and (s._token >= -1).all()):
        raise BadInput("channel stats: absmax must be |absmax_value| at a prompt and position >= 0")


def _array(v: Any, name: str, dtype: Any, shape: tuple[int, ...]) -> Any:
    import numpy as np

    try:
        arr = np.asarray(v)
    except ValueError:
        arr = None
    kinds = "iu" if dtype == np.int64 else "iuf"
    if arr is None or arr.shape != shape or (arr.size and arr.dtype.kind not in kinds):
        got = arr.shape if arr is not None else "a ragged list"
        raise BadInput(f"channel stats: {name} must be {shape} numbers for width {shape[0]}, "
                       f"got {got}")
    return arr.astype(dtype)


def _as_list(v: Any, name: str) -> list:
    if not isinstance(v, (list, tuple)):
        raise BadInput(f"channel stats: {name} must be a list, got {type(v).__name__}")
    return list(v)


def _edge_out(e: float) -> float | str:
    return "inf" if e == math.inf else e


def _edge_in(e: Any) -> float:
    if e == "inf":
        return math.inf
    if isinstance(e, bool) or not isinstance(e, (int, float)):
        raise BadInput(f"channel stats: a bin edge must be a number or \"inf\", got {e!r}")
    return float(e)


def _edges_text(edges: Sequence[float]) -> str:
    return "(" + ", ".join(f"{e:g}" for e in edges) + ")"
