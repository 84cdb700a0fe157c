"""The notes of `fptrace features` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

MASSIVE = note(
    "features_massive", ("features", "report"),
    "a position's vector is over ten times the median norm of the prompt's positions (a massive "
    "activation, usually at the first token)",
    "{site}: position {positions} holds a massive activation (‖x‖ {norm:.4g}, {ratio:.0f}× the "
    "median): its decomposition is exact (the error term holds what the dictionary misses, "
    "relative error {error:.3g} there) but it is left out of the FVU, as SAE trainers leave it "
    "out of training")

ATTRIBUTION_WITHHELD = note(
    "features_attribution_withheld", ("features", "report"),
    "the logit split through a dictionary does not sum to the model's logit within the dtype's "
    "tolerance",
    "the logit split through {site} is withheld: its terms sum to {total:.6g} against the "
    "model's {logit:.6g} (difference {difference:+.2e}; {tolerance})")

NOT_IN_STREAM = note(
    "features_not_in_stream", ("features", "report"),
    "the dictionary reconstructs the MLP's input, which is not a part of the final stream",
    "no logit split for {site}: the MLP's input is not a part of the stream the LM head reads")

SOFTCAP = note(
    "features_softcap", ("features", "report"),
    "the model soft-caps its final logits (Gemma 2/3)",
    "the model soft-caps its logits at {cap:g}: the logit split sums to the logit before the cap")
