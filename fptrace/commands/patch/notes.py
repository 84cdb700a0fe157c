"""The notes of `fptrace patch` (fptrace/notes.py collects them)."""

from __future__ import annotations

from fptrace.notes import note

WEAK_CORRUPTION = note(
    "patch_weak_corruption", ("patch", "report"),
    "the corruption lowers the target's probability by less than 0.05",
    "the corruption barely changes the target's probability ({clean:.3f} → {corrupt:.3f}): the "
    "grid shows little; try a larger --noise-scale or another corruption")
