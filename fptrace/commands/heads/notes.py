"""The notes of `fptrace heads` (fptrace/notes.py collects them): the story of the grid, one
sentence per role, and the walkthrough's claims held against it."""

from __future__ import annotations

from fptrace.notes import note

HEADS = ("heads", "report", "tui")

HEADS_ROLE = note(
    "heads_role", HEADS,
    "some head has the role (its score clears the threshold and, where the role has a check, "
    "the check agrees)",
    "the {n} {role} head{s} (score ≥ {threshold:g}, {how}) {are} in {blocks}: {heads}")

HEADS_ROLE_NONE = note(
    "heads_role_none", HEADS,
    "no head has the role",
    "no head has the {role} role (score ≥ {threshold:g}, {how})")

HEADS_PATTERN_ONLY = note(
    "heads_pattern_only", HEADS,
    "some head's pattern score clears a role's threshold while the check by intervention "
    "disagrees",
    "{heads}: the {role} score clears {threshold:g} but {why}: pattern only, no role")

HEADS_CLAIM = note(
    "heads_claim", HEADS,
    "a role the walkthrough places (previous-token heads early, subject heads in the middle) "
    "has heads here",
    "the walkthrough puts {role} heads in {where} blocks: here {k} of {n} are in {span}: "
    "{verdict}")

HEADS_CLAIM_UNTESTED = note(
    "heads_claim_untested", HEADS,
    "a role the walkthrough places has no head here",
    "the walkthrough puts {role} heads in {where} blocks: here no head has the role, so the "
    "claim is not tested")

HEADS_NO_OV = note(
    "heads_no_ov", HEADS,
    "the family's value weights or norms are not ones fptrace reads for the OV circuit",
    "{family}: the OV scores (copying, eigenvalues) are withheld: fptrace cannot read this "
    "family's W_V or norms; the pattern scores are exact")

HEADS_UNCHECKED = note(
    "heads_unchecked", HEADS,
    "--no-check: the checks by intervention were not run",
    "--no-check: roles come from the pattern scores alone, not checked by intervention")
