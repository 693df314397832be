"""A claim's lease outlasts every attempt its retry policy allows, and is never shorter
than the configured minimum."""

from __future__ import annotations

from devtools.registries import capability
from dispatcher.worker.claims import lease_seconds


def test_the_lease_covers_every_attempt_and_backoff_plus_the_margin() -> None:
    # 3 attempts of at most 2 s each, 2 backoffs of at most 0.05 s: 6.1 s of sending.
    refund = capability("refund", timeout=2.0, attempts=3, backoff=(0.01, 0.05))
    assert lease_seconds(refund, minimum=1.0, margin=0.5) == 6.1 + 0.5


def test_the_lease_is_never_shorter_than_the_minimum() -> None:
    quick = capability("quick", timeout=0.1, attempts=1)
    assert lease_seconds(quick, minimum=30.0, margin=0.5) == 30.0
