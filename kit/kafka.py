"""Closing an aiokafka consumer all the way, even when the broker has just gone away.

``AIOKafkaConsumer.stop()`` closes its fetcher by cancelling each fetch in flight and then
awaiting it. A fetch that a broker failure left waiting out its retry backoff does not
absorb that cancellation, so ``stop()`` raises ``CancelledError`` although nobody
cancelled its caller (aiokafka issue 647, open since 2020), and leaves the consumer's
connections open. Caught as a cancellation of the caller, it cuts short whatever the
caller's clean-up still had to close: in a loop of consumers, every one after it.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def stop_consumer(consumer: Any) -> None:
    """``consumer.stop()``, finished when aiokafka lets one of its own fetches'
    cancellations out of it; a cancellation of the caller itself goes on as ever."""
    task = asyncio.current_task()
    asked = task.cancelling() if task is not None else 0
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        if task is None or task.cancelling() > asked:
            raise
        await _finish(consumer)


async def _finish(consumer: Any) -> None:
    """What ``stop()`` had left to do after the stray cancellation: the fetches still in
    flight cancelled and waited for (``asyncio.wait`` lets none of their cancellations
    out), then the client closed."""
    fetcher = consumer._fetcher
    pending = [t for t in (fetcher._pending_tasks if fetcher else ()) if not t.done()]
    for fetch in pending:
        fetch.cancel()
    if pending:
        await asyncio.wait(pending)
    await consumer._client.close()
