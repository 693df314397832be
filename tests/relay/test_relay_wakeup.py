"""The relay's listener against PostgreSQL: it listens only while told to (an idle
relay), stops listening once told not to (a relay reading a stream), and each time it
listens again wakes the relay once, so that the read after it finds what committed
while nobody listened."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from outbox_relay.table import notify_channel
from outbox_relay.wakeup import listen
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.postgres

CHANNEL = notify_channel("outbox")


async def _notify(database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,))


async def _listener_said(database_url: str, verb: str) -> bool:
    """Whether the listener's connection last sent ``verb`` (LISTEN or UNLISTEN)."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND query = %s",
            (f'{verb} "{CHANNEL}"',),
        )
        row = await cur.fetchone()
        return row is not None and row[0] == 1


async def _woken(wake: asyncio.Event) -> None:
    await asyncio.wait_for(wake.wait(), timeout=10)  # bounds a hung test only
    wake.clear()


async def test_listens_only_while_wanted_and_wakes_the_relay_when_it_starts_again(
    database_url: str,
) -> None:
    wake, wanted, stop = asyncio.Event(), asyncio.Event(), asyncio.Event()
    wanted.set()
    task = asyncio.create_task(listen(database_url, CHANNEL, wake, wanted, stop))
    try:
        await _woken(wake)  # listening: the relay reads once
        await _notify(database_url)
        await _woken(wake)  # a notification wakes it

        # A stream: the relay reads on its own; the next notification is the last.
        wanted.clear()
        await _notify(database_url)
        await eventually(
            lambda: _listener_said(database_url, "UNLISTEN"), within=10, what="UNLISTEN"
        )
        wake.clear()

        # Idle again: it listens and wakes the relay without any notification, for
        # what committed while nobody listened.
        wanted.set()
        await _woken(wake)
        assert await _listener_said(database_url, "LISTEN")
        await _notify(database_url)
        await _woken(wake)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)
