"""`fptrace patch`: causal tracing (activation patching) of where a prediction is carried.

Meng et al. 2022 ("Locating and Editing Factual Associations in GPT", figure 1): run the clean
prompt; corrupt it (Gaussian noise on the subject's token embeddings, 3 × the embedding's own
standard deviation, seeded; or a second prompt of the same length); then rerun the corrupted
input with one state restored from the clean run, for every (layer, position). The probability
of the target token with that state restored says how much of the prediction it carries.

The patched runs are batched: each row of a forward pass restores a different (layer,
position), so a 30 × 6 grid takes a few forward passes, not 180. Hooks come off whatever
happens (hooks.hooked).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fptrace.commands.patch.notes import WEAK_CORRUPTION
from fptrace.commands.patch.result import PatchCell, PatchResult
from fptrace.core.fragments import subject_positions, token_id
from fptrace.core.hooks import Hook, first_output, hooked
from fptrace.core.trace import base_notes, model_info, ranked_token
from fptrace.errors import BadInput, param
from fptrace.families.kinds import EmbedScale
from fptrace.models.loading import LoadedModel
from fptrace.models.prompts import Prompt

if TYPE_CHECKING:
    from torch import nn

WHAT = ("resid", "attn", "mlp")


def embedding_std(lm: LoadedModel) -> float:
    """The standard deviation of the embedding vectors the blocks receive: of the token
    embedding matrix, times √d for families that scale it (Gemma)."""
    import math

    std = float(lm.parts.embed.weight.detach().float().std())
    if lm.parts.family.embed_scale is EmbedScale.sqrt_d:
        std *= math.sqrt(int(lm.config.hidden_size))
    return std


def patch_rows(what: str, L: int, T: int, window: int) -> list[list[tuple[int, int]]]:
    """One row per (layer, position) of the grid, layer-major: the (layer, position) states it
    restores. resid restores one block output; attn/mlp a window of `window` layers centred
    on the row's layer (clipped at the ends)."""
    rows = []
    for layer in range(L):
        lo = 0 if what == "resid" else max(0, min(layer - window // 2, L - window))
        layers = [layer] if what == "resid" else list(range(lo, min(L, lo + window)))
        for pos in range(T):
            rows.append([(l, pos) for l in layers])
    return rows


class Patcher:
    """Runs the clean prompt once (keeping every state a patch may restore), then any number
    of corrupted runs, each row of a batch restoring its own set of (layer, position)."""

    def __init__(self, lm: LoadedModel, clean_ids: list[int], corrupt_ids: list[int],
                 what: str, noise: Any = None) -> None:
        import torch

        self.lm, self.what = lm, what
        self.clean_ids, self.corrupt_ids = clean_ids, corrupt_ids
        self.noise = noise  # (T, d) added to the embedding output, or None
        modules = {"resid": lm.parts.blocks, "attn": lm.parts.attn_adds,
                   "mlp": lm.parts.mlp_adds}[what]
        self.modules = list(modules)
        clean: list[Any] = [None] * len(self.modules)

        def keep(i: int):
            def hook(module: nn.Module, args: tuple, output: Any) -> None:
                clean[i] = first_output(output)[0].detach().clone()  # (T, d)
            return hook

        with torch.inference_mode(), hooked([Hook.after(m, keep(i))
                                             for i, m in enumerate(self.modules)]):
            self.clean_logits = lm.model(torch.tensor([clean_ids], device=lm.device),
                                         use_cache=False, logits_to_keep=1).logits[0, -1].float()
        self.clean = clean

    def probs(self, rows: Sequence[Sequence[tuple[int, int]]], target: int,
              batch_size: int) -> list[float]:
        """The target's probability at the last position for each row of patches (a row:
        the (layer, position) states restored from the clean run; [] restores nothing)."""
        out: list[float] = []
        for start in range(0, len(rows), batch_size):
            out += self._batch(rows[start:start + batch_size], target)
        return out

    def _batch(self, rows: Sequence[Sequence[tuple[int, int]]], target: int) -> list[float]:
        import torch

        lm = self.lm
        B = len(rows)
        per_module: dict[int, tuple[list[int], list[int]]] = {}
        for r, patches in enumerate(rows):
            for layer, pos in patches:
                rs, ps = per_module.setdefault(layer, ([], []))
                rs.append(r)
                ps.append(pos)

        def restore(i: int):
            def hook(module: nn.Module, args: tuple, output: Any) -> Any:
                if i not in per_module:
                    return None
                rs, ps = per_module[i]
                h = first_output(output).clone()
                h[rs, ps] = self.clean[i][ps].to(h.dtype)
                return (h, *output[1:]) if isinstance(output, tuple) else h
            return hook

        hooks = [Hook.after(m, restore(i)) for i, m in enumerate(self.modules)]
        if self.noise is not None:
            noise = self.noise

            def corrupt(module: nn.Module, args: tuple, output: Any) -> Any:
                return output + noise.to(output.dtype)  # (B, T, d) + (T, d)

            hooks.insert(0, Hook.after(lm.parts.embed, corrupt))
        ids = torch.tensor([self.corrupt_ids] * B, device=lm.device)
        with torch.inference_mode(), hooked(hooks):
            logits = lm.model(ids, use_cache=False, logits_to_keep=1).logits[:, -1].float()
        return torch.softmax(logits, dim=-1)[:, target].tolist()


def patch(lm: LoadedModel, prompt: Prompt, *, noise: str | None = None,
          corrupt: Prompt | None = None, what: str = "resid", window: int = 1,
          target: str | None = None, noise_scale: float = 3.0, seed: int = 0,
          batch_size: int = 32, noise_occurrence: int | None = None) -> PatchResult:
    """The layers × positions grid of the target's probability with one state restored."""
    import torch


    if what not in WHAT:
        raise BadInput(f"{param('what')} {what!r}: use resid, attn or mlp")
    if (noise is None) == (corrupt is None):
        raise BadInput(f"give one corruption: {param('noise')} SUBJECT (noise on its embeddings) "
                       f"or "
                       f"{param('corrupt')} PROMPT (a prompt of the same length)")
    if batch_size < 1:
        raise BadInput(f"{param('batch_size')} must be at least 1")
    if noise_scale <= 0:
        raise BadInput(f"{param('noise_scale')} must be above 0")
    info = model_info(lm)
    L = info.n_layers
    if not 1 <= window <= L:
        raise BadInput(f"{param('window')} {window}: {lm.name} has {L} blocks; use 1 to {L}")
    if what == "resid" and window != 1:
        raise BadInput(f"{param('window')} goes with {param('what')} attn or mlp (resid restores "
                       f"one block output)")
    prepared = lm.prepare(prompt)
    ids = list(prepared.ids)
    T = len(ids)
    noise_t, subject, std = None, (), None
    if noise is not None:
        subject = tuple(subject_positions(lm, prepared, noise, noise_occurrence))
        std = noise_scale * embedding_std(lm)
        g = torch.Generator().manual_seed(seed)
        noise_t = torch.zeros(T, info.d_model)
        noise_t[list(subject)] = torch.randn(len(subject), info.d_model, generator=g) * std
        noise_t = noise_t.to(lm.device)
        corrupt_prepared = prepared
        corrupt_ids = ids
    else:
        corrupt_prepared = lm.prepare(corrupt)
        corrupt_ids = list(corrupt_prepared.ids)
        if len(corrupt_ids) != T:
            raise BadInput(
                f"the prompts have different lengths: clean {T} tokens "
                f"({' '.join(repr(lm.token_text(i)) for i in ids)}), corrupt {len(corrupt_ids)} "
                f"({' '.join(repr(lm.token_text(i)) for i in corrupt_ids)}); patching needs the "
                "same positions in both")
    _check_memory(lm, batch_size, T)
    p = Patcher(lm, ids, corrupt_ids, what, noise_t)
    t = int(p.clean_logits.argmax()) if target is None else token_id(lm, target, "--target", prepared)
    target_token = ranked_token(lm, p.clean_logits, t)
    p_clean = target_token.prob
    p_corrupt = p.probs([[]], t, 1)[0]
    rows = patch_rows(what, L, T, window)
    flat = p.probs(rows, t, batch_size)
    grid = tuple(tuple(flat[l * T:(l + 1) * T]) for l in range(L))
    best = sorted(((v, l, i) for l, r in enumerate(grid) for i, v in enumerate(r)),
                  reverse=True)[:5]
    notes = base_notes(lm)
    if p_clean - p_corrupt < 0.05:
        notes.append(WEAK_CORRUPTION(clean=p_clean, corrupt=p_corrupt))
    return PatchResult(
        prompt=prepared.text, model=info, tokens=lm.tokens(prepared),
        corrupt_tokens=lm.tokens(corrupt_prepared), corruption="noise" if noise else "prompt",
        subject=noise, subject_positions=subject, noise_std=std, noise_scale=noise_scale,
        seed=seed, what=what, window=window,
        target=target_token,
        p_clean=p_clean, p_corrupt=p_corrupt, grid=grid,
        best=tuple(PatchCell(layer=l, position=i, prob=v) for v, l, i in best),
        forward_passes=2 + (len(rows) + batch_size - 1) // batch_size, notes=tuple(notes))


def _check_memory(lm: LoadedModel, batch_size: int, T: int) -> None:
    import torch

    from fptrace.models.memory import check_forward_fits

    check_forward_fits(lm.config, lm.device, torch.empty((), dtype=lm.dtype).element_size(),
                       batch_size, T, f"a batch of {batch_size} patched runs of {T} tokens",
                       "lower --batch-size")
