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

ABLATE_EXPERT_RENORM = note(
    "ablate_expert_renormalise", ("ablate",),
    "--expert with --route renormalise on a family whose chosen experts' weights always sum to "
    "the same",
    "an expert removed: each position that chose it keeps its other chosen experts, their "
    "weights renormalised to sum to {total} again, as {family} renormalises them")

ABLATE_EXPERT_KEPT = note(
    "ablate_expert_kept", ("ablate",),
    "--expert with --route renormalise on a family (or config) that does not renormalise its "
    "chosen experts' weights",
    "an expert removed: {family} does not renormalise its chosen experts' weights (this "
    "config), so each position that chose it keeps the others at their weights; --route next "
    "gives it its next choice instead")

ABLATE_EXPERT_NEXT = note(
    "ablate_expert_next", ("ablate",),
    "--expert with --route next",
    "an expert removed: each position that chose it took its next choice, the router's rule "
    "({family}'s) run again without it, every weight as the rule gives it")

ABLATE_EXPERT_NONE_LEFT = note(
    "ablate_expert_none_left", ("ablate",),
    "--expert removing every expert the last position chose at a block (--route renormalise), or "
    "every expert of the block (--route next)",
    "with {removed} removed, no expert is left for the last position to take at block "
    "{block}: the routed experts add nothing there (shared experts, where the family has "
    "them, still do)")

ABLATE_EXPERT_UNCHOSEN = note(
    "ablate_expert_unchosen", ("ablate",),
    "an expert removed that the last position did not choose at its block",
    "the last position did not choose {experts}: the direct effect is 0, any total effect "
    "comes through earlier positions")
