"""How a next token is chosen from one row of logits: greedy, temperature, top-k, top-p.

Pure functions: each takes a 1-D tensor of logits (or probabilities) and returns a new tensor,
never changing its input. A draw takes an explicit seed, so the same call gives the same token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fptrace.errors import BadInput, as_parameter

if TYPE_CHECKING:
    import torch


def check_options(temperature: float, top_k: int, top_p: float, *,
                  named: Callable[[str], str] = as_parameter) -> None:
    """Reject values no sampler accepts, each named as `named` says (the CLI: its flag)."""
    if not temperature >= 0:  # also catches NaN
        raise BadInput(f"{named('temperature')} must be 0 or more (0 means greedy), "
                       f"not {temperature}")
    if top_k < 1:
        raise BadInput(f"{named('top_k')} must be at least 1, not {top_k}")
    if not 0 < top_p <= 1:
        raise BadInput(f"{named('top_p')} must be in (0, 1], not {top_p}")


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """A one-hot distribution on the highest logit (the first one on a tie)."""
    import torch

    out = torch.zeros_like(logits, dtype=torch.float32)
    out[int(torch.argmax(logits))] = 1.0
    return out


def with_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / temperature); temperature 0 is greedy."""
    import torch

    if temperature < 0:
        raise BadInput(f"temperature must be 0 or more, not {temperature}")
    if temperature == 0:
        return greedy(logits)
    return torch.softmax(logits.float() / temperature, dim=-1)


def keep_top_k(probs: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k most probable tokens and renormalise; every other token gets 0."""
    import torch

    if k < 1:
        raise BadInput(f"top-k must be at least 1, not {k}")
    k = min(k, probs.shape[-1])
    idx = torch.topk(probs, k).indices
    out = torch.zeros_like(probs)
    out[idx] = probs[idx]
    return out / out.sum()


def keep_top_p(probs: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus: keep the smallest set of most probable tokens whose mass reaches p, and
    renormalise. A token is kept when the mass of the tokens ranked above it is below p."""
    import torch

    if not 0 < p <= 1:
        raise BadInput(f"top-p must be in (0, 1], not {p}")
    sorted_p, order = torch.sort(probs, descending=True)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass ranked above each token
    keep_sorted = before < p
    keep_sorted[0] = True
    out = torch.zeros_like(probs)
    kept = order[keep_sorted]
    out[kept] = probs[kept]
    return out / out.sum()


def draw(probs: torch.Tensor, seed: int) -> int:
    """One token id drawn from probs with a generator seeded by `seed`."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    return int(torch.multinomial(probs.detach().float().cpu(), 1, generator=gen))


def check_generation(temperature: float, top_k: int | None, top_p: float, *,
                     named: Callable[[str], str] = as_parameter, off: str = "None") -> None:
    """The options of generation, where top-k may be off (None; `off`: how the caller says
    it, the CLI's 0)."""
    if top_k is not None and top_k < 1:
        raise BadInput(f"{named('top_k')} must be at least 1 (or {off} for off), not {top_k}")
    check_options(temperature, 1, top_p, named=named)


def distribution(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float
                 ) -> torch.Tensor:
    """The one distribution generation draws from: temperature (0 = greedy), then top-k
    (None = off), then top-p (1 = off)."""
    check_generation(temperature, top_k, top_p)
    probs = with_temperature(logits, temperature)
    if temperature == 0:
        return probs
    if top_k is not None:
        probs = keep_top_k(probs, top_k)
    if top_p < 1:
        probs = keep_top_p(probs, top_p)
    return probs


def describe(temperature: float, top_k: int | None, top_p: float) -> str:
    if temperature == 0:
        return "greedy"
    parts = [f"temperature {temperature:g}"]
    if top_k is not None:
        parts.append(f"top-k {top_k}")
    if top_p < 1:
        parts.append(f"top-p {top_p:g}")
    return ", ".join(parts)


def strategies(logits: torch.Tensor, temperature: float, top_k: int, top_p: float
               ) -> list[tuple[str, torch.Tensor]]:
    """The four ways side by side, each as (label, distribution over the vocabulary).
    top-k and top-p are applied after the temperature, as generation libraries do."""
    check_options(temperature, top_k, top_p)
    tempered = with_temperature(logits, temperature)
    t = f"{temperature:g}"
    return [
        ("greedy", greedy(logits)),
        (f"temperature {t}", tempered),
        (f"top-k {top_k}, T {t}", keep_top_k(tempered, top_k)),
        (f"top-p {top_p:g}, T {t}", keep_top_p(tempered, top_p)),
    ]


__all__ = [
    "check_generation",
    "check_options",
    "describe",
    "distribution",
    "draw",
    "greedy",
    "keep_top_k",
    "keep_top_p",
    "strategies",
    "with_temperature",
]


def eos_ids(model: Any) -> set[int]:
    """The end-of-text token ids of a transformers model (its generation config's and its
    config's): where generation stops."""
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    return ids
