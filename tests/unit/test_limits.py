"""The per-tenant limits of dispatcher.api.limits, on an injected clock (no sleeps)."""

from __future__ import annotations

import pytest

from dispatcher.api.limits import LongPollSlots
from dispatcher.buckets import TokenBuckets
from dispatcher.errors import RateLimited


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_admits_its_burst_then_refuses_with_whole_seconds_then_refills() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate=0.4, burst=3, clock=clock)
    for _ in range(3):
        buckets.take("acme")
    with pytest.raises(RateLimited) as refused:
        buckets.take("acme")
    # One token takes 2.5 s at 0.4/s: Retry-After is whole seconds, rounded up.
    assert refused.value.retry_after == 3
    assert refused.value.extra["retryAfterSeconds"] == 3
    assert refused.value.status == 429 and refused.value.code == "rate_limited"

    buckets.take("globex")  # another tenant has a bucket of its own

    clock.now += 2.0  # 0.8 of a token: still refused, and the refusal spent nothing
    with pytest.raises(RateLimited) as again:
        buckets.take("acme")
    assert again.value.retry_after == 1
    clock.now += 0.5
    buckets.take("acme")
    with pytest.raises(RateLimited):
        buckets.take("acme")


def test_a_bucket_never_holds_more_than_its_burst() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate=100.0, burst=2, clock=clock)
    buckets.take("acme")
    clock.now += 3600
    buckets.take("acme")
    buckets.take("acme")
    with pytest.raises(RateLimited):
        buckets.take("acme")


def test_rate_zero_turns_the_limit_off() -> None:
    buckets = TokenBuckets(rate=0, burst=1, clock=Clock())
    for _ in range(10_000):
        buckets.take("acme")


def test_long_poll_slots_are_per_tenant_and_given_back() -> None:
    slots = LongPollSlots(cap=2)
    slots.acquire("acme")
    slots.acquire("acme")
    with pytest.raises(RateLimited) as refused:
        slots.acquire("acme")
    assert refused.value.retry_after == 1
    slots.acquire("globex")
    slots.release("acme")
    slots.acquire("acme")
    assert LongPollSlots(cap=0).acquire("acme") is None  # 0: no cap
