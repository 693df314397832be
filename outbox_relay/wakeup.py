"""LISTEN for the outbox's insert trigger, so an idle relay reads the moment a row
commits instead of at its next poll.

The notification is only a hint: the relay still reads the table, and polls anyway,
so a notification lost while this connection was down costs at most one poll
interval. After every (re)connect it wakes the relay once for the same reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

import psycopg
from psycopg import sql

from kit.signals import sleep_unless

log = logging.getLogger(__name__)


async def listen(
    conninfo: str,
    statement: sql.Composed,
    wake: asyncio.Event,
    stop: asyncio.Event,
    *,
    retry_delay: float = 1.0,
) -> None:
    """Set ``wake`` on every notification until ``stop``; reconnects on its own."""
    while not stop.is_set():
        try:
            async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                await conn.execute(statement)
                wake.set()
                while not stop.is_set():
                    # A bounded wait, so a stop request is noticed without cancelling
                    # the connection in the middle of a read.
                    async for _ in conn.notifies(timeout=0.5):
                        wake.set()
        except psycopg.OperationalError as exc:
            log.warning("LISTEN connection lost (%s); polling until it is back", exc)
            if await sleep_unless(stop, retry_delay):
                return


async def wait_first(*waits: Awaitable[Any], seconds: float) -> None:
    """Until the first of ``waits`` completes, or ``seconds`` pass; the others are
    cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
