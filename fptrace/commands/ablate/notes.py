"""The notes of `fptrace ablate` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

ABLATE_SOFTCAP = note(
    "ablate_softcap", ("ablate", "report", "tui"),
    "the model soft-caps its final logits (Gemma 2/3)",
    "the model soft-caps its logits at {cap:g}: the logits here are the LM head's, before the "
    "cap, like attribute's; the probabilities are the model's own")

ABLATE_WO_BIAS = note(
    "ablate_wo_bias", ("ablate", "report", "tui"),
    "a head is removed and the attention output projection has a bias",
    "the blocks of the removed heads keep their attention output projection's bias, which "
    "belongs to no head")

ABLATE_MEAN = note(
    "ablate_mean", ("ablate", "report"),
    "--mode mean: a removed part's output is replaced by its mean",
    "mean ablation: each removed part output its mean over {n} positions, the same at every "
    "position")
