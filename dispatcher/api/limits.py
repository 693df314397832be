"""Per-tenant limits of the shared front door: a token bucket on submissions and a cap
on the long-polls a tenant holds open at once.

Both live in the API process's memory: a limit protects this process's event loop and
the database pool it owns, so a count per process is what matters (N API processes
admit N times the rate, which is the capacity they add). Tenants are the configured
API keys' tenants, so the tables stay as small as the key list.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.errors import RateLimited
from dispatcher.settings import Settings


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class TokenBuckets:
    """One bucket per tenant: ``burst`` tokens, refilled at ``rate`` per second.
    ``rate`` 0 turns the limit off. ``clock`` is injectable so tests move time
    instead of sleeping."""

    def __init__(
        self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = max(burst, 1)
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, tenant: str) -> None:
        """Spend one of ``tenant``'s tokens, or raise :class:`RateLimited` with the
        whole seconds until one is there (nothing is spent then)."""
        if self.rate <= 0:
            return
        now = self._clock()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(float(self.burst), now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return
        wait = (1 - bucket.tokens) / self.rate
        raise RateLimited(
            f"tenant {tenant!r} submits more than {self.rate:g} calls per second"
            f" (burst {self.burst})",
            retry_after=max(1, math.ceil(wait)),
        )


class LongPollSlots:
    """At most ``cap`` long-polls held open per tenant (0: no cap)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._held: dict[str, int] = {}

    def acquire(self, tenant: str) -> None:
        """Take a slot or raise :class:`RateLimited`; :meth:`release` gives it back."""
        held = self._held.get(tenant, 0)
        if self.cap > 0 and held >= self.cap:
            # One second: a held long-poll ends within MAX_WAIT_SECONDS, often much
            # sooner, and a client told to wait a second polls far less than one
            # answered at once and looping.
            raise RateLimited(
                f"tenant {tenant!r} already holds {held} long-polls (the cap)",
                retry_after=1,
            )
        self._held[tenant] = held + 1

    def release(self, tenant: str) -> None:
        left = self._held.get(tenant, 0) - 1
        if left > 0:
            self._held[tenant] = left
        else:
            self._held.pop(tenant, None)


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits one API app enforces, built from its settings."""

    submissions: TokenBuckets
    long_polls: LongPollSlots

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(
            TokenBuckets(settings.submit_rate_per_second, settings.submit_burst),
            LongPollSlots(settings.long_polls_per_tenant),
        )
