"""The wait between failed batches grows only while attempts make no progress."""

from __future__ import annotations

import asyncio
import logging

import pytest

from outbox_relay.backoff import Backoff
from outbox_relay.relay import BatchResult, Relay, TransientPublishError
from tests.fixtures.relay import relay_config

INITIAL = 0.01
CAP = 0.08


def _failed(published: int) -> TransientPublishError:
    return TransientPublishError("some rows not acknowledged", published=published)


def test_grows_only_across_attempts_without_progress() -> None:
    backoff = Backoff(initial=0.1, cap=1.0)
    assert backoff.delay == 0.0
    assert [backoff.after(progress=False) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    # One row got through: back to the initial wait, then growing again from there.
    assert backoff.after(progress=True) == 0.1
    assert backoff.after(progress=False) == 0.2
    assert backoff.after(progress=True) == 0.1
    assert backoff.after(progress=True) == 0.1


def test_success_resets() -> None:
    backoff = Backoff(initial=0.1, cap=1.0)
    for _ in range(5):
        backoff.after(progress=False)
    backoff.reset()
    assert backoff.delay == 0.0
    assert backoff.after(progress=False) == 0.1


def test_a_long_outage_stays_at_the_cap() -> None:
    backoff = Backoff(initial=0.1, cap=30.0)
    for _ in range(5000):
        delay = backoff.after(progress=False)
    assert delay == 30.0


class ScriptedRelay(Relay):
    """A relay whose batches end as scripted; the loop around them is the real one."""

    def __init__(self, script: list[BaseException | BatchResult], stop: asyncio.Event) -> None:
        super().__init__(
            relay_config(
                "postgresql://unused@127.0.0.1/unused",
                "127.0.0.1:1",
                backoff_initial=INITIAL,
                backoff_max=CAP,
                batch_size=10,
            )
        )
        self._script = script
        self._stop = stop

    async def run_once(self) -> BatchResult:
        step = self._script.pop(0)
        if not self._script:
            self._stop.set()
        if isinstance(step, BaseException):
            raise step
        return step


async def test_partial_progress_resets_the_wait(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    full = BatchResult(read=10, published=10)  # a full batch: the loop reads again at once
    relay = ScriptedRelay(
        [
            _failed(0),
            _failed(0),
            _failed(0),
            _failed(0),
            _failed(0),
            _failed(3),  # some rows got through: start again from the initial wait
            _failed(0),
            _failed(2),
            full,  # a whole batch got through
            _failed(0),
            full,
        ],
        stop,
    )
    caplog.set_level(logging.WARNING, logger="outbox_relay.relay")
    try:
        await relay._loop(stop)
    finally:
        await relay._producer.stop()
    delays = [
        r.args[1]
        for r in caplog.records
        if isinstance(r.args, tuple) and r.msg.startswith("relay batch failed")
    ]
    expected = [INITIAL * 2**n for n in range(4)] + [CAP, INITIAL, 2 * INITIAL, INITIAL, INITIAL]
    assert len(delays) == len(expected)
    for got, base in zip(delays, expected, strict=True):
        # Up to one initial wait of jitter on top.
        assert base <= got <= base + INITIAL, (delays, expected)
