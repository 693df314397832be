"""Per-tenant limits of the shared front door: a token bucket on submissions and a cap
on the long-polls a tenant holds open at once.

Both live in the API process's memory: a limit protects this process's event loop and
the database pool it owns, so a count per process is what matters (N API processes
admit N times the rate, which is the capacity they add). Tenants are the configured
API keys' tenants, so the tables stay as small as the key list.
"""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.buckets import TokenBuckets
from dispatcher.errors import RateLimited
from dispatcher.settings import Settings


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
