"""kit.periodic: a step every so often until stopped, surviving its errors. The waits
between steps are recorded by a stand-in for ``sleep_unless`` (no clock), except in
the tests of stopping, which need the real wait to be cut short."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from kit import periodic as periodic_module
from kit.periodic import STEP_ERRORS, STEP_SECONDS, periodic
from tests.fixtures.metrics import sample

NAME = "test_periodic"


@pytest.fixture(autouse=True)
def _no_series_left() -> Iterator[None]:
    """The test's loop name is no loop of the service: its series go with the test (the
    label checks hold every sample the session leaves to the service's loop names)."""
    yield
    for metric in (STEP_ERRORS, STEP_SECONDS):
        try:
            metric.remove(NAME)
        except KeyError:
            pass


class Script:
    """A step that fails or succeeds as told, one outcome a call, and sets ``stop`` in
    its last call; and the waits the loop asked for between steps."""

    def __init__(self, stop: asyncio.Event, *outcomes: Exception | None) -> None:
        self.stop = stop
        self.outcomes = list(outcomes)
        self.calls = 0
        self.waits: list[float] = []

    async def step(self) -> None:
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if not self.outcomes:
            self.stop.set()
        if outcome is not None:
            raise outcome

    async def sleep_unless(self, stop: asyncio.Event, seconds: float) -> bool:
        self.waits.append(seconds)
        await asyncio.sleep(0)
        return stop.is_set()


async def run_script(
    monkeypatch: pytest.MonkeyPatch,
    *outcomes: Exception | None,
    every: float = 1.0,
    backoff_max: float | None = None,
    first_delay: float = 0.0,
) -> Script:
    stop = asyncio.Event()
    script = Script(stop, *outcomes)
    monkeypatch.setattr(periodic_module, "sleep_unless", script.sleep_unless)
    await asyncio.wait_for(
        periodic(
            stop, every, script.step, name=NAME, backoff_max=backoff_max, first_delay=first_delay
        ),
        5,
    )
    return script


BOOM = RuntimeError("database away")


async def test_a_step_that_raises_is_logged_and_the_loop_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="kit.periodic"):
        script = await run_script(monkeypatch, BOOM, None, None)
    assert script.calls == 3
    (record,) = caplog.records
    assert record.getMessage().startswith(f"{NAME}: step failed (1 in a row)")
    assert record.exc_info is not None and record.exc_info[1] is BOOM


async def test_each_failed_step_is_counted_and_no_successful_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = sample("loop_step_errors_total", loop=NAME)
    await run_script(monkeypatch, BOOM, None, BOOM, BOOM, None)
    assert sample("loop_step_errors_total", loop=NAME) - before == 3


async def test_the_wait_doubles_after_each_failure_up_to_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = await run_script(monkeypatch, BOOM, BOOM, BOOM, BOOM, None, every=1.0, backoff_max=5)
    # The first step at once, then 2, 4, 8 -> 5, 16 -> 5, and the interval after success.
    assert script.waits == [0.0, 2.0, 4.0, 5.0, 5.0, 1.0]


async def test_the_cap_is_ten_intervals_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    script = await run_script(monkeypatch, *[BOOM] * 5, every=0.5)
    assert script.waits == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]


async def test_a_successful_step_resets_the_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    script = await run_script(monkeypatch, BOOM, BOOM, None, BOOM, None, every=1.0)
    assert script.waits == [0.0, 2.0, 4.0, 1.0, 2.0, 1.0]


async def test_the_first_step_waits_the_first_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    script = await run_script(monkeypatch, None, None, every=3.0, first_delay=7.0)
    assert script.waits == [7.0, 3.0, 3.0]


async def test_each_step_is_timed_failed_ones_included(monkeypatch: pytest.MonkeyPatch) -> None:
    stop = asyncio.Event()
    script = Script(stop, BOOM, None, None)
    monkeypatch.setattr(periodic_module, "sleep_unless", script.sleep_unless)

    async def slow_step() -> None:
        await asyncio.sleep(0.05)
        await script.step()

    count = sample("loop_step_seconds_count", loop=NAME)
    total = sample("loop_step_seconds_sum", loop=NAME)
    await asyncio.wait_for(periodic(stop, 1.0, slow_step, name=NAME), 5)
    assert sample("loop_step_seconds_count", loop=NAME) - count == 3
    assert sample("loop_step_seconds_sum", loop=NAME) - total >= 3 * 0.05
    # Each in the bucket of its duration: none of them under 25 ms.
    assert sample("loop_step_seconds_bucket", loop=NAME, le="0.025") == 0


async def test_a_stop_cuts_the_wait_short() -> None:
    stop = asyncio.Event()
    ran = asyncio.Event()

    async def step() -> None:
        ran.set()

    loop = asyncio.create_task(periodic(stop, 3600.0, step, name=NAME))
    await asyncio.wait_for(ran.wait(), 5)
    stop.set()
    # An hour's wait, ended by the stop at once.
    await asyncio.wait_for(loop, 1.0)


async def test_a_stop_during_a_step_lets_it_finish_and_runs_no_other() -> None:
    stop = asyncio.Event()
    finished: list[int] = []

    async def step() -> None:
        stop.set()
        await asyncio.sleep(0.05)  # the stop does not cut the step itself short
        finished.append(1)

    await asyncio.wait_for(periodic(stop, 0.01, step, name=NAME), 5)
    assert finished == [1]


async def test_a_set_stop_runs_no_step() -> None:
    stop = asyncio.Event()
    stop.set()
    calls: list[int] = []

    async def step() -> None:
        calls.append(1)

    await asyncio.wait_for(periodic(stop, 0.01, step, name=NAME), 5)
    assert calls == []


async def test_a_cancelled_loop_is_not_taken_for_a_failed_step() -> None:
    stop = asyncio.Event()
    started = asyncio.Event()

    async def step() -> None:
        started.set()
        await asyncio.sleep(3600)

    before = sample("loop_step_errors_total", loop=NAME)
    loop = asyncio.create_task(periodic(stop, 1.0, step, name=NAME))
    await asyncio.wait_for(started.wait(), 5)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(loop, 1.0)
    assert sample("loop_step_errors_total", loop=NAME) == before
