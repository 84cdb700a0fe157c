"""The checks by intervention that turn a pattern score into a role (docs/heads.md).

- induction: each candidate head removed at the repeated half's positions (zero, ablate's
  batched hooks: one row a head), the mean loss on the repeated half of the induction
  sequences; the head is an induction head where the loss rises by more than LOSS_MIN nats;
- previous-token: on the prompts, one earlier token j replaced by a seeded random token (one row
  per j, the clean prompt in row 0); the candidate head's output (its slice of W_O's input)
  changes at each later position; the head reads the previous token where its mean change at
  j + 1 is larger than its mean change at the positions after j + 1 (the share > 1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from fptrace.addresses import Head
from fptrace.core.hooks import Hook, StopForward, hooked
from fptrace.core.interventions import Part, ablation_hooks
from fptrace.families.parts import dims, output_projection
from fptrace.models.loading import LoadedModel

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fptrace.commands.heads.patterns import Item

BATCH = 32  # rows per forward pass, at most ...
CHECK_BYTES = 1 << 30  # ... and fewer where a pass of the induction check would take more
PASS_TOKENS = 40  # what a pass costs beyond its tokens, in tokens (benchmarks/README.md)
PREVIOUS_PROMPTS = 6  # prompts the previous-token check replaces tokens in ...
PREVIOUS_TOKENS = 32  # ... each cut to its first tokens


def induction_check(lm: LoadedModel, rand: Sequence[Item], n: int, heads: Sequence[Head],
                    clean: float | None, states: dict | None = None,
                    firsts: dict | None = None) -> dict[Head, float]:
    """Per head: the mean repeated-half loss with it removed at the second copy's positions
    n … 2n − 1 minus the clean one (nats).

    The head is removed where induction acts, on the repeated half only: the model being
    causal, every block's computation at the first copy's positions is then the clean one. With
    `firsts` (each sequence's clean keys and values of the first copy's positions, block by
    block: sequence -> [(keys (1, kv heads, n, hd), values)], read from the model's own KV
    cache in the clean pass), a pass runs only the second copy, attending to the first copy
    through a cache made of those rows (a copy per pass: a forward appends to it); without, it
    runs the whole sequence with the head zeroed at the second copy's positions only (the same
    figures; tests/test_heads.py holds both ways equal). Either way it stops before position
    2n − 1, whose prediction the loss does not read.

    With `states` (each sequence's clean block outputs: sequence -> [(output (T, d), whether
    the block returns a tuple)] block by block), the blocks before the earliest removed head of
    a pass are not run again: removing a head of block l changes nothing before block l, so the
    clean outputs stand in for them (tests/test_heads.py holds both ways equal). The rows (one
    per head and sequence, by block) are cut into the passes that cost least (cheapest_passes:
    a pass runs all its rows from its earliest head's block; a pass costs PASS_TOKENS beyond its
    tokens; a pass of more than one row holds at most CHECK_BYTES). Each pass stops at the
    final norm's input; the LM head then takes only the positions whose prediction the loss
    reads (repeated_losses)."""
    import torch

    from fptrace.commands.heads.patterns import repeated_losses
    from fptrace.models.kv_cache import cache_kwargs, cache_of
    from fptrace.models.memory import forward_bytes

    out: dict[Head, float] = {}
    if clean is None:
        return out
    L = len(lm.parts.blocks)
    pairs = [(h, it) for h in sorted(heads, key=lambda h: (h.layer, h.head)) for it in rand]
    # a pass runs positions begin … 2n − 2: the last position's prediction is not in the loss,
    # and (the model being causal) nothing read depends on it
    begin = n if firsts is not None else 0
    run = 2 * n - 1 - begin

    # a row's memory in a pass: its activations, the cache of the first copy it attends to
    # (a copy per pass), its stand-in block output
    dm = dims(lm.config, lm.parts.family)
    size = torch.empty((), dtype=lm.dtype).element_size()
    cached = 2 * L * (n + run) * dm.n_kv_heads * dm.head_dim
    row_bytes = forward_bytes(lm.config, 1, run, 0, size) + (cached + run * dm.d_model) * size

    def cost(j: int, i: int) -> float | None:
        if i - j > 1 and (i - j) * row_bytes > CHECK_BYTES:
            return None
        first = pairs[j][0].layer if states is not None else 0
        return (i - j) * run * (L - first) + PASS_TOKENS * L

    totals = dict.fromkeys(heads, 0.0)
    for start, stop in cheapest_passes(len(pairs), BATCH, cost):
        chunk = pairs[start:stop]
        rows = [(Part(h.layer, h.head),) for h, _ in chunk]
        first = min(h.layer for h, _ in chunk)
        x = torch.tensor([list(it.ids[begin:2 * n - 1]) for _, it in chunk], device=lm.device)
        kwargs = cache_kwargs(lm.model, None if firsts is None else
                              cache_of([firsts[it] for _, it in chunk]))
        got: list[torch.Tensor] = []

        def grab(module: nn.Module, args: tuple, got: list = got) -> None:
            got.append(args[0])
            raise StopForward  # the LM head is taken below, at the positions read

        stand = None if states is None else \
            [[(o[begin:2 * n - 1], t) for o, t in states[it]] for _, it in chunk]
        try:
            with torch.inference_mode(), \
                    hooked(ablation_hooks(lm, rows, None, positions=None if begin else
                                          range(n, 2 * n - 1)), prepend=True), \
                    hooked([Hook.before(lm.parts.final_norm, grab)]), \
                    clean_blocks(lm, first, stand):
                lm.model(x, logits_to_keep=1, **kwargs)
        except StopForward:
            pass
        losses = repeated_losses(lm, got[0][:, n - begin:], [it.ids for _, it in chunk], n)
        for (h, _), loss in zip(chunk, losses, strict=True):
            totals[h] += loss
    for h in heads:
        out[h] = totals[h] / len(rand) - clean
    return out


def cheapest_passes(n: int, most: int, cost: Callable[[int, int], float | None]
                    ) -> list[tuple[int, int]]:
    """Items 0 … n − 1 (in order) cut into passes [start, stop) of at most `most` items that
    minimise the sum of cost(start, stop) (a pass's cost; None: too large a pass, and so is any
    pass that holds it; a pass of one item is always made)."""
    best = [0.0] + [float("inf")] * n  # best[i]: the least cost of the first i items
    cut = [0] * (n + 1)  # the last pass of the first i items starts at cut[i]
    for i in range(1, n + 1):
        for j in range(i - 1, max(i - most, 0) - 1, -1):
            c = cost(j, i)
            if c is None and j < i - 1:
                break
            c = best[j] + (c or 0.0)
            if c < best[i]:
                best[i], cut[i] = c, j
    out: list[tuple[int, int]] = []
    i = n
    while i > 0:
        out.insert(0, (cut[i], i))
        i = cut[i]
    return out


@contextmanager
def clean_blocks(lm: LoadedModel, upto: int, rows: list | None) -> Iterator[None]:
    """Blocks 0 … upto − 1 return their clean outputs instead of running (rows[r]: row r's
    clean block outputs); their forward is restored on leaving. Nothing with rows None or
    upto 0."""
    import torch

    if rows is None or upto == 0:
        yield
        return
    is_tuple = rows[0][upto - 1][1]
    hidden = torch.stack([r[upto - 1][0] for r in rows])  # (B, T, d): block upto − 1's output
    value = (hidden,) if is_tuple else hidden

    def stand_in(*args: object, **kwargs: object) -> object:
        return value  # the blocks before it are never read past block upto − 1

    blocks = lm.parts.blocks[:upto]
    for b in blocks:
        b.forward = stand_in
    try:
        yield
    finally:
        for b in blocks:
            del b.forward


def previous_check(lm: LoadedModel, items: Sequence[Item], heads: Sequence[Head], seed: int
                   ) -> dict[Head, float]:
    """Per head: its mean output change at j + 1 over its mean change at the positions after
    j + 1, when token j is replaced (j ≥ 1), over the first prompts of 4 tokens or more."""
    import torch

    dm = dims(lm.config, lm.parts.family)
    hd, H = dm.head_dim, dm.n_heads
    layers = sorted({h.layer for h in heads})
    prompts = [it.ids[:PREVIOUS_TOKENS] for it in items if len(it.ids) >= 4][:PREVIOUS_PROMPTS]
    nxt = torch.zeros(dm.n_layers, H, dtype=torch.float64)
    later = torch.zeros(dm.n_layers, H, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    for ids in prompts:
        T = len(ids)
        js = list(range(1, T - 2))  # a later position after j + 1 exists
        rows = [list(ids)]
        for j in js:
            row = list(ids)
            new = int(torch.randint(0, dm.vocab_size, (1,), generator=g))
            row[j] = new if new != ids[j] else (new + 1) % dm.vocab_size
            rows.append(row)
        got: dict[int, torch.Tensor] = {}

        def keep(layer: int, got: dict = got, B: int = len(rows), T: int = T):
            def hook(module: nn.Module, args: tuple) -> None:
                z = args[0].float().view(B, T, H, hd)  # (B, T, H, hd)
                got[layer] = torch.linalg.vector_norm(z[1:] - z[:1], dim=-1).double().cpu()
                if layer == layers[-1]:
                    raise StopForward  # no later block is read
            return hook

        hooks = [Hook.before(output_projection(lm.parts.attns[l], lm.parts.family.w_o)[0],
                             keep(l)) for l in layers]
        try:
            with torch.inference_mode(), hooked(hooks):
                lm.model(torch.tensor(rows, device=lm.device), use_cache=False,
                         logits_to_keep=1)
        except StopForward:
            pass
        for l in layers:
            change = got[l]  # (len(js), T, H)
            for r, j in enumerate(js):
                nxt[l] += change[r, j + 1]
                later[l] += change[r, j + 2:].mean(0)
    return {h: float(nxt[h.layer, h.head] / later[h.layer, h.head].clamp(min=1e-12))
            for h in heads}


__all__ = ["cheapest_passes", "clean_blocks", "induction_check", "previous_check"]
