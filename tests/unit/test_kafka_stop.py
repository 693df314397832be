"""kit.kafka.stop_consumer's own logic, over a stand-in that closes as aiokafka 0.14's
consumer does (each fetch in flight cancelled, then awaited). The real consumer, in a
real outage: tests/bus/test_bus_submitter.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from kit.kafka import stop_consumer


class Closing:
    """A consumer whose fetches are each in a retry backoff, and whose ``stop()`` closes
    them as aiokafka's ``Fetcher.close`` does; ``hold`` keeps ``stop()`` waiting first."""

    def __init__(self, fetches: int, hold: asyncio.Event | None = None) -> None:
        tasks = {asyncio.create_task(asyncio.sleep(3600)) for _ in range(fetches)}
        self._fetcher = SimpleNamespace(_pending_tasks=tasks)
        self._client = SimpleNamespace(close=self._close_client)
        self.client_closed = False
        self._hold = hold

    async def _close_client(self) -> None:
        self.client_closed = True

    async def stop(self) -> None:
        if self._hold is not None:
            await self._hold.wait()
        for fetch in self._fetcher._pending_tasks:
            fetch.cancel()
            await fetch
        await self._client.close()


async def test_a_stray_cancellation_is_absorbed_and_the_close_finished() -> None:
    consumer = Closing(fetches=3)
    await asyncio.sleep(0)  # the fetches are waiting
    async with asyncio.timeout(10):  # a fetch left uncancelled would wait an hour
        await stop_consumer(consumer)
    assert all(t.done() for t in consumer._fetcher._pending_tasks)
    assert consumer.client_closed


async def test_a_cancelled_caller_is_still_cancelled() -> None:
    hold = asyncio.Event()
    consumer = Closing(fetches=1, hold=hold)
    stopping = asyncio.create_task(stop_consumer(consumer))
    await asyncio.sleep(0)
    stopping.cancel()  # the caller itself, while stop() waits
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert not consumer.client_closed
    for fetch in consumer._fetcher._pending_tasks:
        fetch.cancel()
