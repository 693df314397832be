"""Per-tenant token buckets: the submission rate limit of the HTTP API
(:mod:`dispatcher.api.limits`) and of bus intake (:mod:`dispatcher.bus.consumer`), kept
in each process's memory."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.errors import RateLimited


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
