"""The roles a head is given, the score each needs, and what a check must measure to agree
(docs/heads.md)."""

from __future__ import annotations

from fptrace.core.activation_stats import SINK_THRESHOLD

ROLES = ("previous-token", "induction", "duplicate-token", "subject")
THRESHOLDS = {"previous-token": 0.4, "induction": 0.4, "duplicate-token": 0.4, "subject": 0.4,
              "sink": SINK_THRESHOLD}
LOSS_MIN = 1e-3  # nats: an induction head's removal raises the repeated half's loss by more

__all__ = ["LOSS_MIN", "ROLES", "THRESHOLDS"]
