"""Examples of `fptrace patch`: its golden view, its bad inputs, its notes' cases."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fptrace.examples import Bench, Case, NoteCase, Render, Said, Setup, View

if TYPE_CHECKING:
    from fptrace.models.loading import LoadedModel

PROMPT = "The cat sat on the mat"


def _weak_corruption(bench: Bench) -> Said:
    """A corruption that changes the answer (other tokens, on a model with sharp logits) and
    one that cannot (the prompt itself)."""
    import torch

    from fptrace.commands.patch.core import patch
    from fptrace.models.loading import wrap_model

    model = bench.tiny("llama")
    with torch.no_grad():
        model.lm_head.weight.mul_(40)  # sharp logits: the clean top-1 is near certain
    lm = wrap_model(model, name="tiny-llama-sharp", random_weights=True)
    strong = patch(lm, [5, 6, 7], corrupt=[900, 901, 902])
    assert strong.p_clean - strong.p_corrupt >= 0.05, (strong.p_clean, strong.p_corrupt)
    weak = patch(lm, [5, 6, 7], corrupt=[5, 6, 7])
    return strong.notes, weak.notes


NOTE_CASES = (NoteCase("patch_weak_corruption", _weak_corruption),)


def _view(lm: LoadedModel, bench: Bench) -> Render:
    from fptrace.commands.patch.core import patch
    from fptrace.commands.patch.render import patch_view

    r = patch(lm, PROMPT, noise=" cat")
    return lambda w: patch_view(r, w)


VIEWS = (View("patch", _view),)


def bad_inputs(at: Setup) -> tuple[Case, ...]:
    """The bad inputs of `fptrace patch` (rows of docs/bad-inputs.md; the files they read are
    made by scripts/bad_inputs.py)."""
    m = at.model
    return (
        Case(1, "--noise not in the prompt", ("patch", "The cat sat", *m, "--noise", " dog")),
        Case(2, "--noise occurring twice",
             ("patch", "the cat and the cat", *m, "--noise", " cat")),
    )
