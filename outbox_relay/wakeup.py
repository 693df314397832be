"""LISTEN for the outbox's insert trigger, so an idle relay reads the moment a row
commits instead of at its next poll.

The notification is only a hint: the relay still reads the table, and polls anyway,
so a notification lost while this connection was down costs at most one poll
interval. After every (re)connect it wakes the relay once for the same reason.

Only an idle relay listens. One that is reading a stream of commits reads again
every ``read_interval`` anyway, and a notification for each commit would cost it,
PostgreSQL and every writer more than the reads themselves: under a steady stream
at 1,000 calls/s the relay's CPU per call halved without them (bench.pipeline). Each
time listening starts again, the relay is woken to read once more: a row committed
before LISTEN took effect notified no one, and that read sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any

import psycopg
from psycopg import sql

from kit.signals import sleep_unless

log = logging.getLogger(__name__)

# Seconds a listener waits before it looks at ``stop`` and ``wanted`` again.
_BOUND = 0.5


async def listen(
    conninfo: str,
    channel: str,
    wake: asyncio.Event,
    wanted: asyncio.Event,
    stop: asyncio.Event,
    *,
    retry_delay: float = 1.0,
) -> None:
    """Set ``wake`` on every notification on ``channel`` while ``wanted`` is set (and
    once each time listening starts), until ``stop``; reconnects on its own."""
    while not stop.is_set():
        try:
            async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                await _follow(conn, sql.Identifier(channel), wake, wanted, stop)
        except psycopg.OperationalError as exc:
            log.warning("LISTEN connection lost (%s); polling until it is back", exc)
            if await sleep_unless(stop, retry_delay):
                return


async def _follow(
    conn: psycopg.AsyncConnection[Any],
    channel: sql.Identifier,
    wake: asyncio.Event,
    wanted: asyncio.Event,
    stop: asyncio.Event,
) -> None:
    listening = False
    while not stop.is_set():
        if not wanted.is_set():
            if listening:
                await conn.execute(sql.SQL("UNLISTEN {}").format(channel))
                listening = False
            await wait_first(stop.wait(), wanted.wait(), seconds=_BOUND)
            continue
        if not listening:
            await conn.execute(sql.SQL("LISTEN {}").format(channel))
            listening = True
            wake.set()
        # A bounded wait, so a stop request is noticed without cancelling the
        # connection in the middle of a read.
        async with contextlib.aclosing(conn.notifies(timeout=_BOUND)) as notifies:
            async for _ in notifies:
                wake.set()
                if not wanted.is_set():
                    break


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
