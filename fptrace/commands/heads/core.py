"""`fptrace heads`: what each attention head does, measured (docs/heads.md).

Pattern scores come from the model's own attention weights (transformers' eager attention, the
prompts batched by length, right-padded: a real position never attends to a later pad):
previous-token, duplicate-token, first-token (the sinks of `fptrace stats`), subject, and
induction on sequences of seeded random tokens repeated once. Position 0 is never
a key of the previous-token, duplicate-token or induction patterns: a head that gives all its
attention to the first token (a sink) would otherwise match "the previous token" at position 1.

Weight scores read the weights alone (weights.py): the OV circuit's copying share and its
eigenvalue sign measure.

A role is given where a score clears its threshold and, for the roles that have a check, the
check agrees (checks.py): an induction head's removal from the repeated half (ablate's batched
zero ablation, at the second copy's positions) raises the loss there; a previous-token head's
output, when one earlier token is replaced, changes at the next position more than at the
later ones. Where the check disagrees the role is "pattern only".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fptrace.addresses import Head, resolve_head
from fptrace.commands.heads.patterns import (
    EVIDENCE,
    Item,
    Tally,
    check_induction,
    induction_items,
    pattern_masks,
    repeated_losses,
    tally,
)
from fptrace.commands.heads.result import Evidence, Heads, HeadScores
from fptrace.commands.heads.roles import LOSS_MIN, ROLES, THRESHOLDS
from fptrace.core.hooks import Hook, eager_attention, hooked
from fptrace.core.trace import base_notes, model_info, sizes
from fptrace.errors import BadInput, UnsupportedModel, param
from fptrace.models.kv_cache import cache_kwargs, cached_rows, plain_cache
from fptrace.models.loading import LoadedModel

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import DynamicCache

    from fptrace.models.prompts import Prompt

INDUCTION_SEQUENCES = 8
INDUCTION_LENGTH = 64
OV_TOKENS = 32  # tokens sampled for the OV copying share
INDUCTION_BATCH = 8  # induction sequences a pass
PROMPT_TOKENS = 2048  # padded tokens a pass of prompts (right-padded to the longest) ...
WEIGHTS_BYTES = 1 << 29  # ... while one block's attention weights stay under 512 MiB
SEQUENCE_TOKEN_BYTES = 48  # an induction sequence's token held (a Python int in a tuple)


def shipped_prompts() -> str:
    """The folder of example prompts next to the package (prompts/ of the repository)."""
    return str(Path(__file__).resolve().parents[3] / "prompts")


def items_of(lm: LoadedModel, prompts: Sequence[Prompt], subjects: Sequence[str | None] = ()
             ) -> list[Item]:
    """The prompts (text, Chat or token ids) as Items, each subject located by its characters
    (core/fragments.py), refusing prompts longer than the context."""
    from fptrace.core.fragments import subject_positions

    out = []
    for k, p in enumerate(prompts):
        prepared = lm.prepare(p)
        subject = subjects[k] if k < len(subjects) else None
        where = None if subject is None else tuple(subject_positions(lm, p, subject,
                                                                     what="subject"))
        name = prepared.text if isinstance(p, str) else f"prompt[{k}]"
        out.append(Item(name, tuple(prepared.ids), where))
    return out


def attention(lm: LoadedModel, rows: Sequence[Sequence[int]],
              each: Callable[[int, torch.Tensor], None] | None = None,
              states: list | None = None, final: list | None = None,
              cache: DynamicCache | None = None) -> None:
    """One pass of `rows` (token ids, all of one length): each(layer, weights) is called with
    every block's attention weights (B, H, T, T) float32 as the block computes them (the model's
    own: transformers' eager attention returns them), which are then dropped: one block's are
    held at a time. With `states` (a list), each block's output (B, T, d) and whether the block
    returns a tuple are appended to it, block by block. With `final` (a list), the final norm's
    input (B, T, d) is appended to it and the pass stops there. With `cache` (an empty cache of
    the model's own, kv_cache.plain_cache), the pass fills it with every block's keys and
    values. With neither `states` nor `final`, the pass stops after the last block's attention:
    nothing after it is read (its MLP, the final norm, the LM head)."""
    import torch

    from fptrace.core.hooks import StopForward, first_output

    def store(module: nn.Module, args: tuple, output: object) -> None:
        if states is not None:
            states.append((first_output(output), isinstance(output, (tuple, list))))

    def keeper(i: int):
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            w = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
            if w is None or w.dim() != 4:
                raise UnsupportedModel(f"block {i}'s attention returned no weights under eager "
                                       f"attention: fptrace heads cannot read {lm.name}'s heads")
            if each is not None:
                each(i, w.float())
            if i == last:
                raise StopForward
        return hook

    def grab(module: nn.Module, args: tuple) -> None:
        if final is not None:
            final.append(args[0])
            raise StopForward  # the caller takes the LM head where it reads it

    last = len(lm.parts.attns) - 1 if states is None and final is None else None
    hooks = [Hook.after(a, keeper(i)) for i, a in enumerate(lm.parts.attns)]
    if states is not None:
        hooks += [Hook.after(b, store) for b in lm.parts.blocks]
    if final is not None:
        hooks.append(Hook.before(lm.parts.final_norm, grab))
    x = torch.tensor([list(r) for r in rows], device=lm.device)  # (B, T)
    kwargs = cache_kwargs(lm.model, cache)
    try:
        with torch.inference_mode(), eager_attention(lm.model), hooked(hooks):
            lm.model(x, logits_to_keep=1, **kwargs)
    except StopForward:
        pass


def tallied(sums: Tally, rows: Sequence[Item], masks: Sequence[dict], focus: Head | None,
            L: int) -> Callable[[int, torch.Tensor], None]:
    """attention()'s `each` for one pass of `rows` (right-padded): the blocks' weights gathered
    until they hold WEIGHTS_BYTES or the last block's came, then tallied row by row (each cut
    to its own length; masks[r]: row r's pattern masks), a few blocks at once: the shipped
    prompts' every block in one product, a long prompt's a block at a time."""
    import torch

    held: list[torch.Tensor] = []  # blocks' weights (B, H, T, T) not yet tallied

    def each(layer: int, w: torch.Tensor) -> None:
        held.append(w)
        if layer < L - 1 and len(held) * w.numel() * 4 < WEIGHTS_BYTES:
            return
        A = torch.stack(held, 1) if len(held) > 1 else held[0][:, None]  # (B, l, H, T, T)
        first = layer - len(held) + 1
        held.clear()
        for b, it in enumerate(rows):
            n = len(it.ids)
            tally(sums, first, A[b, :, :, :n, :n], it, masks[b], focus)
    return each


def fits(lm: LoadedModel, items: Sequence[Item], sequences: int, length: int, check: bool,
         ov_tokens: int = 0) -> None:
    """Refuse, before any pass and before the induction sequences are drawn, what would not fit
    in memory (one line, where the system would kill the process, or the resident server
    answering it): the pass of the longest prompt or induction sequence alone, one block's
    attention weights read whole (the model's scores and weights, their product with a
    pattern's mask: three times H × T² floats) and the row's pattern masks (three T × T); and
    the `sequences` induction sequences of 2·`length` tokens themselves, with what the induction
    check holds for each from the clean pass (each block's output, T × d, and the keys and
    values of the pass's cache, which the first copy's rows keep alive); and the OV scores' copies
    of the embedding and LM head (float32, V × d each, four at most) with every block's values
    of the `ov_tokens` sampled tokens (weights.ov_scores)."""
    import torch

    from fptrace.families.parts import dims
    from fptrace.models.memory import check_forward_fits, check_held_fits

    info = model_info(lm)
    L, H, d = info.n_layers, info.n_heads, info.d_model
    kv = dims(lm.config, lm.parts.family)
    kv_width = kv.n_kv_heads * kv.head_dim  # a position's keys (or values) in a block
    size = torch.empty((), dtype=lm.dtype).element_size()
    T = 2 * length if sequences else 0
    longest = max([len(it.ids) for it in items] + [T])
    if longest:
        check_forward_fits(lm.config, lm.device, size, 1, longest,
                           f"fptrace heads' pass over {longest:,} tokens (each block's "
                           f"attention weights read whole: {H} heads × {longest:,}²)",
                           f"give shorter prompts or a shorter {param('induction')} LEN",
                           extra_bytes=3 * (H + 1) * longest * longest * 4)
    if sequences:
        held = sequences * T * (SEQUENCE_TOKEN_BYTES + (
            L * (d + 2 * kv_width) * size if check else 0))
        check_forward_fits(lm.config, lm.device, size, 1, T,
                           f"{sequences:,} induction sequences of {T:,} tokens"
                           + (" (each one's block outputs and first copy's keys and values "
                              "held for the check)" if check else ""),
                           f"give fewer {param('induction')} sequences"
                           + (", or run without the check (--no-check)" if check else ""),
                           extra_bytes=held)
    if ov_tokens:
        ov = 4 * (4 * info.vocab_size * d + ov_tokens * L * kv_width)
        check_held_fits(ov, lm.device, f"the OV scores over {ov_tokens:,} sampled tokens (the "
                        "embedding's and LM head's float32 copies, each block's values of the "
                        "tokens)", f"sample fewer {param('ov_tokens')}")


def prompt_batches(items: Sequence[Item], heads: int) -> list[list[Item]]:
    """The prompts by length, cut into the passes that cost least (checks.cheapest_passes): a
    pass of B prompts padded to the longest one's T costs B·T tokens plus PASS_TOKENS; it holds
    at most PROMPT_TOKENS padded tokens, and one block's attention weights (its `heads` heads'
    T × T at the longest prompt's T, float32) stay under WEIGHTS_BYTES. (Eight prompts a pass
    padded six shipped prompts of 8–10 tokens to 92 beside two of 90 and 92: 1,232 tokens for
    682.)"""
    from fptrace.commands.heads.checks import PASS_TOKENS, cheapest_passes

    order = sorted(items, key=lambda it: len(it.ids))

    def cost(j: int, i: int) -> float | None:
        B, T = i - j, len(order[i - 1].ids)  # sorted: the last is the longest
        if B * T > PROMPT_TOKENS or B * heads * T * T * 4 > WEIGHTS_BYTES:
            return None
        return B * T + PASS_TOKENS

    return [order[j:i] for j, i in cheapest_passes(len(order), len(order), cost)]


def heads(lm: LoadedModel, prompts: Sequence[Prompt] = (), *, subjects: Sequence[str | None] = (),
          seed: int = 0, induction: int = INDUCTION_SEQUENCES,
          induction_length: int = INDUCTION_LENGTH, check: bool = True,
          weights: bool = True, head: Head | None = None, ov_tokens: int = OV_TOKENS) -> Heads:
    """Every attention head's pattern scores over `prompts` (text, Chat or token ids; subjects[k]
    the subject of prompts[k] or None) and `induction` sequences of `induction_length` seeded
    random tokens repeated once, its OV weight scores, the checks by intervention, and the
    roles they support (docs/heads.md)."""
    from fptrace.commands.heads.checks import induction_check, previous_check
    from fptrace.commands.heads.story import story
    from fptrace.commands.heads.weights import ov_scores

    info = model_info(lm)
    L, H = info.n_layers, info.n_heads
    focus = None if head is None else resolve_head(head, sizes(lm), "head")
    items = items_of(lm, prompts, subjects)
    if items and all(len(it.ids) < 3 for it in items):
        raise BadInput("every prompt is shorter than 3 tokens: the previous-token score needs a "
                       "query i ≥ 2 (its previous token not the first); give a longer prompt")
    ctx = info.context_length
    for it in items:
        if ctx and len(it.ids) > ctx:
            raise BadInput(f"{it.name!r} is {len(it.ids)} tokens, beyond {lm.name}'s context "
                           f"of {ctx}")
    check_induction(lm, induction, induction_length)
    if weights and ov_tokens > info.vocab_size:
        raise BadInput(f"{param('ov_tokens')} {ov_tokens:,}: {lm.name}'s vocabulary has "
                       f"{info.vocab_size:,} tokens; sample at most that many")
    fits(lm, items, induction, induction_length, check, ov_tokens if weights else 0)
    rand = induction_items(lm, induction, induction_length, seed)
    if not rand and not any(pattern_masks(it.ids)["duplicate"].any() for it in items):
        raise BadInput("no token repeats within a prompt (after the first position) and "
                       f"{param('induction')} 0: the duplicate-token score needs one; add a "
                       f"prompt with a "
                       "repeated word, or induction sequences")
    if not items and not rand:
        raise BadInput("nothing to score: give prompts or induction sequences")
    sums = Tally(L, H)
    for chunk in prompt_batches(items, H):
        # right padding: a real position attends only to earlier ones, so no pad enters its
        # softmax (the pads' own rows are cut off)
        T = max(len(it.ids) for it in chunk)
        attention(lm, [list(it.ids) + [it.ids[-1]] * (T - len(it.ids)) for it in chunk],
                  tallied(sums, chunk, [pattern_masks(it.ids) for it in chunk], focus, L))
    clean_losses = []
    clean_states: dict[Item, list[tuple[torch.Tensor, bool]]] = {}  # sequence -> block outputs
    # sequence -> the first copy's keys and values, block by block (None: the model's cache
    # cannot be extended row by row, the check runs whole sequences)
    firsts: dict[Item, list] | None = {} if check and plain_cache(lm) is not None else None
    half = induction_length
    step = max(1, min(INDUCTION_BATCH, WEIGHTS_BYTES // (H * (2 * half) ** 2 * 4 or 1)))
    for start in range(0, len(rand), step):  # one length: batched
        chunk = rand[start:start + step]
        kept: list[tuple[torch.Tensor, bool]] = []
        final: list[torch.Tensor] = []
        cache = None if firsts is None else plain_cache(lm)
        masks = [{k: m for k, m in pattern_masks(it.ids, induction_length).items()
                  if k in ("duplicate", "induction")} for it in chunk]
        attention(lm, [it.ids for it in chunk], tallied(sums, chunk, masks, focus, L),
                  states=kept if check else None, final=final, cache=cache)
        for b, it in enumerate(chunk):
            clean_states[it] = [(out[b], is_tuple) for out, is_tuple in kept]
            if firsts is not None and cache is not None:
                firsts[it] = cached_rows(cache, b, half)
        # the same loss as the check's (repeated_losses): the clean and the removed-head
        # figures differ by the removal alone, not by two ways of taking the loss
        clean_losses += repeated_losses(lm, final[0][:, half:2 * half - 1],
                                        [it.ids for it in chunk], half)
    clean_loss = sum(clean_losses) / len(clean_losses) if clean_losses else None
    scores = {s: sums.mean(s) for s in ("previous", "duplicate", "induction", "first",
                                         "subject")}
    ov = ov_scores(lm, seed, ov_tokens) if weights else None
    notes = base_notes(lm) + ([] if ov is None else list(ov.notes))

    def score(name: str, l: int, h: int) -> float | None:
        s = scores[name]
        return None if s is None else float(s[l, h])

    cand = {role: [Head(l, h) for l in range(L) for h in range(H)
                   if (score(key, l, h) or 0.0) >= THRESHOLDS[role]]
            for role, key in (("previous-token", "previous"), ("induction", "induction"),
                              ("duplicate-token", "duplicate"), ("subject", "subject"))}
    loss = induction_check(lm, rand, induction_length, cand["induction"], clean_loss,
                           clean_states, firsts) \
        if check and rand and cand["induction"] else {}
    nxt = previous_check(lm, items, cand["previous-token"], seed) \
        if check and cand["previous-token"] else {}
    rows = []
    for l in range(L):
        for h in range(H):
            hd = Head(l, h)
            roles: list[str] = []
            only: list[str] = []
            for role in ROLES:
                if hd not in cand[role]:
                    continue
                agrees = {"induction": loss.get(hd, 0.0) > LOSS_MIN if check else True,
                          "previous-token": nxt.get(hd, 0.0) > 1.0 if check else True
                          }.get(role, True)
                (roles if agrees else only).append(role)
            first = float(scores["first"][l, h]) if scores["first"] is not None else 0.0
            if first >= THRESHOLDS["sink"]:
                roles.append("sink")
            rows.append(HeadScores(
                layer=l, head=h, previous=score("previous", l, h),
                duplicate=score("duplicate", l, h), induction=score("induction", l, h),
                first=first, subject=score("subject", l, h),
                copying=None if ov is None or ov.copying is None else float(ov.copying[l][h]),
                eigen=None if ov is None or ov.eigen is None else float(ov.eigen[l][h]),
                loss_change=loss.get(hd), next_share=nxt.get(hd), roles=tuple(roles),
                pattern_only=tuple(only)))
    evidence = _evidence(lm, sums.evidence)
    checks = () if ov is None else tuple(ov.checks)
    result_rows = tuple(rows)
    return Heads(
        model=info, prompts=len(items), seed=seed, induction_sequences=len(rand),
        induction_length=induction_length if rand else 0, clean_loss=clean_loss,
        thresholds=tuple(THRESHOLDS.items()), heads=result_rows,
        story=tuple(story(result_rows, L, check)), evidence=evidence,
        focus=None if focus is None else str(focus), checks=checks,
        ok=all(c.ok for c in checks), notes=tuple(notes))


def _evidence(lm: LoadedModel, found: list) -> tuple[Evidence, ...]:
    top = sorted(found, key=lambda e: -e[1])[:EVIDENCE]
    return tuple(Evidence(prompt=f"{score}: {name}", query=q, key=k, weight=w,
                          query_text=lm.token_text(qi), key_text=lm.token_text(ki))
                 for score, w, name, q, k, qi, ki in top)


__all__ = ["attention", "heads", "items_of", "shipped_prompts"]
