"""Examples of `fptrace tokens`: its golden views, its bad inputs, its note's case."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fptrace.examples import Bench, Case, NoteCase, Render, Said, Setup, View

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel


def _not_in_tokenizer(bench: Bench) -> Said:
    """GPT-2's tokenizer holds all 50,257 ids of its vocabulary (no case where it holds is
    cheap: no bundled model pads its vocabulary past its tokenizer)."""
    from fptrace.commands.tokens.core import tokens

    return tokens("gpt2", (0, 50256)).notes, None


NOTE_CASES = (NoteCase("tokens_not_in_tokenizer", _not_in_tokenizer),)


def _view(lm: LoadedModel, bench: Bench) -> Render:
    import dataclasses

    from fptrace.commands.tokens.core import tokens
    from fptrace.commands.tokens.render import tokens_view

    result = dataclasses.replace(tokens("gpt2", "The cat sat on the mat"), seconds=0.0)
    return lambda w: tokens_view(result, w)


def _ids_view(lm: LoadedModel, bench: Bench) -> Render:
    import dataclasses

    from fptrace.commands.tokens.core import tokens
    from fptrace.commands.tokens.render import tokens_view

    result = dataclasses.replace(tokens("gpt2", (0, 319, 866, 50256)), seconds=0.0)
    return lambda w: tokens_view(result, w)


VIEWS = (View("tokens", _view), View("tokens-ids", _ids_view))


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace tokens`, those of --ids / --ids-file among them (rows of
    docs/bad-inputs.md; the files they read are made by scripts/bad_inputs.py). The other
    commands' --ids cases are in their folders."""
    return (
        Case(1, "--ids: an id beyond the vocabulary", ("tokens", "--ids", "5,50257", "-m",
                                                         "gpt2")),
        Case(2, "--ids: a negative id", ("tokens", "--ids", "5,-1", "-m", "gpt2")),
        Case(3, "--ids: an Arabic-Indic digit", ("tokens", "--ids", "\u0663", "-m", "gpt2")),
        Case(4, "--ids: an empty list", ("tokens", "--ids", " , ", "-m", "gpt2")),
        Case(5, "both --ids and --ids-file",
             ("tokens", "--ids", "5", "--ids-file", at.path("ids-1e6.txt"), "-m", "gpt2")),
        Case(6, "--ids-file: not a list of ids",
             ("tokens", "--ids-file", at.path("robot.json"), "-m", "gpt2")),
        Case(7, "tokens: neither a text nor --ids", ("tokens", "-m", "gpt2")),
    )
