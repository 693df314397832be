"""Settles tool calls whose outcome is unknown by asking the provider; escalates the
ones nobody can settle automatically. See :mod:`reconciler.loop` for the mechanism and
:mod:`reconciler.policy` for the decision table."""

from reconciler.loop import Reconciler
from reconciler.metrics import Tally
from reconciler.policy import Decision, Observation, Situation, Verdict, backoff_seconds, decide

__all__ = [
    "Decision",
    "Observation",
    "Reconciler",
    "Situation",
    "Tally",
    "Verdict",
    "backoff_seconds",
    "decide",
]
