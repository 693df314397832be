"""Mutants of ``outbox_relay/relay.py`` the broker tests leave alive
(``python -m bench.mutation --module outbox_relay/relay.py``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from outbox_relay.relay import BatchResult, Relay, TransientPublishError
from outbox_relay.schedule import heartbeat_waits, purge_due
from tests.fixtures.relay import relay_config


def test_a_transient_publish_error_says_why_and_how_many_rows_were_marked() -> None:
    # The relay logs the error and backs off: its text is all an operator sees of why.
    error = TransientPublishError("broker did not acknowledge 3 rows", published=7)
    assert str(error) == "broker did not acknowledge 3 rows"
    assert error.published == 7
    assert TransientPublishError("away").published == 0


def test_leases_are_renewed_three_times_a_term_and_a_failed_renewal_retried_soon() -> None:
    # Two renewals in a row can fail before a lease lapses.
    assert heartbeat_waits(15.0) == (5.0, 1.0)
    # Within a second, but never sooner than the next renewal would be due anyway.
    assert heartbeat_waits(3.0) == (1.0, 1.0)
    assert heartbeat_waits(0.6) == pytest.approx((0.2, 0.2))


def test_retention_runs_when_due_and_then_once_per_interval() -> None:
    assert purge_due(100.0, 100.0, 60.0) == (True, 160.0)
    assert purge_due(100.5, 100.0, 60.0) == (True, 160.5)
    assert purge_due(99.5, 100.0, 60.0) == (False, 100.0)


class StepRelay(Relay):
    """A relay whose batches are scripted steps; the loop around them is the real one."""

    def __init__(self, steps: list[Callable[[Relay], BatchResult]], **overrides: Any) -> None:
        super().__init__(
            relay_config(
                "postgresql://unused@127.0.0.1/unused", "127.0.0.1:1", batch_size=10, **overrides
            )
        )
        self.steps = steps
        self.batches = 0

    async def run_once(self) -> BatchResult:
        self.batches += 1
        return self.steps.pop(0)(self)


async def _run_loop(relay: StepRelay, stop: asyncio.Event) -> None:
    try:
        # A loop that waits when it should read again would wait out the poll interval.
        await asyncio.wait_for(relay._loop(stop), 5)
    finally:
        await relay._producer.stop()


async def test_a_full_batch_is_followed_by_the_next_read_at_once() -> None:
    stop = asyncio.Event()

    def last(_: Relay) -> BatchResult:
        stop.set()
        return BatchResult(read=10, published=10)

    relay = StepRelay(
        [lambda _: BatchResult(read=10, published=10)] * 2 + [last], poll_interval=600
    )
    await _run_loop(relay, stop)
    assert relay.batches == 3


async def test_a_short_batch_waits_for_a_notification() -> None:
    stop = asyncio.Event()

    def last(_: Relay) -> BatchResult:
        stop.set()
        return BatchResult()

    relay = StepRelay([lambda _: BatchResult(read=3, published=3), last], poll_interval=600)
    loop = asyncio.create_task(_run_loop(relay, stop))
    await asyncio.sleep(0.05)
    assert relay.batches == 1  # idle, waiting
    relay._wake.set()  # what the LISTEN task does on a notification
    await loop
    assert relay.batches == 2


async def test_a_notification_during_a_batch_is_not_lost() -> None:
    stop = asyncio.Event()

    def notified(relay: Relay) -> BatchResult:
        relay._wake.set()  # a row committed while the batch was in flight
        return BatchResult(read=3, published=3)

    def last(_: Relay) -> BatchResult:
        stop.set()
        return BatchResult()

    relay = StepRelay([notified, last], poll_interval=600)
    await _run_loop(relay, stop)
    assert relay.batches == 2


async def test_without_a_notification_an_idle_relay_polls() -> None:
    stop = asyncio.Event()

    def last(_: Relay) -> BatchResult:
        stop.set()
        return BatchResult()

    relay = StepRelay([lambda _: BatchResult(), lambda _: BatchResult(), last], poll_interval=0.01)
    await _run_loop(relay, stop)
    assert relay.batches == 3


async def test_one_row_published_counts_as_progress(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    initial = 0.01

    def failing(published: int) -> Callable[[Relay], BatchResult]:
        def step(_: Relay) -> BatchResult:
            raise TransientPublishError("not acknowledged", published=published)

        return step

    def last(_: Relay) -> BatchResult:
        stop.set()
        return BatchResult()

    relay = StepRelay(
        [failing(0), failing(0), failing(0), failing(1), last],
        backoff_initial=initial,
        backoff_max=1.0,
    )
    caplog.set_level(logging.WARNING, logger="outbox_relay.relay")
    await _run_loop(relay, stop)
    delays = [r.args[1] for r in caplog.records if r.msg.startswith("relay batch failed")]
    # Doubling while nothing got through, back to the initial wait after one row did
    # (plus up to one initial wait of jitter each).
    expected = [initial, 2 * initial, 4 * initial, initial]
    assert len(delays) == len(expected)
    for got, base in zip(delays, expected, strict=True):
        assert base <= got <= base + initial, (delays, expected)  # type: ignore[operator]
