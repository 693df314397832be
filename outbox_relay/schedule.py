"""When the relay's background chores run: pure, no I/O, so each cadence is tested
without a clock.
"""

from __future__ import annotations

LEASE_RENEWALS = 3
"""Renewals per lease term: two in a row can fail before a lease lapses."""
RETRY_CAP = 1.0
"""The longest wait before retrying a failed renewal (seconds)."""


def heartbeat_waits(lease_ttl: float) -> tuple[float, float]:
    """Seconds between lease renewals, and before retrying a failed one: soon, so a
    database blip costs no lease, yet never sooner than the next renewal is due."""
    every = lease_ttl / LEASE_RENEWALS
    return every, min(every, RETRY_CAP)


def purge_due(now: float, due: float, interval: float) -> tuple[bool, float]:
    """Whether retention runs at ``now`` (it was ``due`` then), and when it is due next."""
    return (True, now + interval) if now >= due else (False, due)
