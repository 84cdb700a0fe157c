"""Examples of `fptrace stats`: its golden view, its bad inputs, its notes' cases."""

from __future__ import annotations

from typing import Any

from fptrace.examples import Bench, NoteCase

PROMPTS = ("The cat sat on the mat", "The dog ran")


def _notes(lm: Any, prompts: tuple[str, ...] = PROMPTS, **kw: Any) -> tuple[str, ...]:
    from fptrace.commands.stats.core import activation_stats

    return activation_stats(lm, list(prompts), **kw).notes


def _gpt2(bench: Bench, random_weights: bool = True) -> Any:
    from fptrace.models.loading import load_model

    return load_model(bench.gpt2_folder(), random_weights=random_weights, device="cpu")


def _random_weights(bench: Bench) -> tuple[Any, Any]:
    trained = _gpt2(bench, random_weights=False)  # its weights as saved: not random
    return _notes(trained), _notes(_gpt2(bench))


def _failed(bench: Bench) -> tuple[Any, Any]:
    lm = _gpt2(bench)
    return _notes(lm), _notes(lm, (PROMPTS[0], "word " * 40))  # 32 positions at most


def _eager_attention(bench: Bench) -> tuple[Any, Any]:
    lm = _gpt2(bench)
    return _notes(lm, sinks=False), _notes(lm)


NOTE_CASES = (NoteCase("stats_random_weights", _random_weights),
              NoteCase("stats_failed", _failed),
              NoteCase("stats_eager_attention", _eager_attention))
