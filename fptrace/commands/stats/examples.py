"""Examples of `fptrace stats`: its golden view, its bad inputs, its notes' cases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fptrace.examples import Bench, Case, NoteCase, Render, Said, Setup, View

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

PROMPT = "The cat sat on the mat"


PROMPTS = (PROMPT, "The dog ran")


def _notes(lm: LoadedModel, prompts: tuple[str, ...] = PROMPTS, **kw: Any) -> tuple[str, ...]:
    from fptrace.commands.stats.core import activation_stats

    return activation_stats(lm, list(prompts), **kw).notes


def _gpt2(bench: Bench, random_weights: bool = True) -> Any:
    from fptrace.models.loading import load_model

    return load_model(bench.gpt2_folder(), random_weights=random_weights, device="cpu")


def _random_weights(bench: Bench) -> Said:
    trained = _gpt2(bench, random_weights=False)  # its weights as saved: not random
    return _notes(trained), _notes(_gpt2(bench))


def _failed(bench: Bench) -> Said:
    lm = _gpt2(bench)
    return _notes(lm), _notes(lm, (PROMPTS[0], "word " * 40))  # 32 positions at most


def _eager_attention(bench: Bench) -> Said:
    lm = _gpt2(bench)
    return _notes(lm, sinks=False), _notes(lm)


NOTE_CASES = (NoteCase("stats_random_weights", _random_weights),
              NoteCase("stats_failed", _failed),
              NoteCase("stats_eager_attention", _eager_attention))


def _view(lm: LoadedModel, bench: Bench) -> Render:
    from fptrace.commands.stats.core import build, collect, new_statistics
    from fptrace.commands.stats.render import stats_view
    from fptrace.core.inputs import PromptItem
    from fptrace.core.trace import model_info

    items = [PromptItem(f"p:{i + 1}", p, f"p.txt:{i + 1}")
             for i, p in enumerate([PROMPT, "The dog ran", "A cat", "On the mat the cat sat"])]
    stats = new_statistics(lm)
    collect(lm, items, stats, batch_size=2)
    r = build(stats, model_info(lm), sink_threshold=0.2)
    return lambda w: stats_view(r, w)


VIEWS = (View("stats", _view),)


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace stats` (rows of docs/bad-inputs.md; the files they read are
    made by scripts/bad_inputs.py)."""
    m = at.model
    p = at.path
    return (
        Case(1, "stats: --merge of two models' statistics",
             ("stats", "--merge", p("s.json"), p("s3.json"))),
        Case(2, "stats: a statistics file of a newer fptrace",
             ("stats", "--merge", p("newer.json"))),
        Case(3, "stats: --out exists, without --resume",
             ("stats", p("prompts.txt"), *m, "--out", p("s.json"))),
        Case(4, "stats: --out is someone else's file",
             ("stats", p("prompts.txt"), *m, "--out", p("notes.json"), "--force")),
        Case(5, "stats: a prompt longer than the context", ("stats", p("long.txt"), *m)),
    )
