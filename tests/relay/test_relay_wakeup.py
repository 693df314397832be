"""The relay's listener against PostgreSQL: it listens only while told to (an idle
relay), stops listening once told not to (a relay reading a stream), and each time it
listens again wakes the relay, at once and a moment later, so that the reads after it
find what committed while nobody listened. While it listens its row in
``outbox_listeners`` is there, and only then does the insert trigger notify."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from outbox_relay.queries import Queries
from outbox_relay.table import notify_channel
from outbox_relay.wakeup import SECOND_LOOK, Presence, listen
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.postgres

CHANNEL = notify_channel("outbox")
PRESENCE = Presence(Queries.for_table("outbox"), "relay-under-test", ttl=30)


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


async def _started_listening(wake: asyncio.Event) -> None:
    """The two wake-ups that listening starts with, the second :data:`SECOND_LOOK`
    after the first (cleared: a later wake-up is a notification's)."""
    await _woken(wake)
    await asyncio.sleep(SECOND_LOOK * 2)
    assert wake.is_set(), "no second look"
    wake.clear()


async def _listeners(database_url: str) -> list[str]:
    """The relays whose listener row has not lapsed."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT relay_id FROM outbox_listeners WHERE until > now() ORDER BY relay_id"
        )
        return [r[0] for r in await cur.fetchall()]


async def test_listens_only_while_wanted_and_wakes_the_relay_when_it_starts_again(
    database_url: str,
) -> None:
    wake, wanted, stop = asyncio.Event(), asyncio.Event(), asyncio.Event()
    wanted.set()
    task = asyncio.create_task(listen(database_url, CHANNEL, wake, wanted, stop, PRESENCE))
    try:
        await _started_listening(wake)  # listening: the relay reads, and once more
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
        await _started_listening(wake)
        assert await _listener_said(database_url, "LISTEN")
        await _notify(database_url)
        await _woken(wake)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


async def test_the_listener_row_is_there_exactly_while_it_listens(database_url: str) -> None:
    wake, wanted, stop = asyncio.Event(), asyncio.Event(), asyncio.Event()
    wanted.set()
    task = asyncio.create_task(listen(database_url, CHANNEL, wake, wanted, stop, PRESENCE))
    try:
        await _woken(wake)  # entered before LISTEN, so before this wake-up
        assert await _listeners(database_url) == [PRESENCE.relay_id]

        wanted.clear()  # a stream: writers need not notify
        await eventually(lambda: _absent(database_url), within=10, what="the listener row deleted")
        wanted.set()
        await _woken(wake)
        assert await _listeners(database_url) == [PRESENCE.relay_id]
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)
    assert await _listeners(database_url) == []  # a stopped relay leaves at once


async def _absent(database_url: str) -> bool:
    return await _listeners(database_url) == []


async def _insert_row(database_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{}'::jsonb)"
        )


async def _notified_by_insert(database_url: str) -> bool:
    """Whether a committed insert into the outbox notified a listening connection."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        heard: list[psycopg.Notify] = []
        conn.add_notify_handler(heard.append)
        await conn.execute(f'LISTEN "{CHANNEL}"')
        await _insert_row(database_url)
        # The insert's commit signalled this backend before it returned: a notification
        # arrives with the replies to these round trips at the latest.
        for _ in range(3):
            await conn.execute("SELECT 1")
            await asyncio.sleep(0.05)
        return bool(heard)


async def test_an_insert_notifies_only_while_a_relay_listens(database_url: str) -> None:
    async def listener(until: str) -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute("DELETE FROM outbox_listeners")
            await conn.execute(
                "INSERT INTO outbox_listeners (relay_id, until)"
                f" VALUES ('r1', now() + interval '{until}')"
            )

    assert not await _notified_by_insert(database_url)  # nobody listens: no lock taken
    await listener("30 seconds")
    assert await _notified_by_insert(database_url)
    await listener("-1 second")  # left behind by a relay that died
    assert not await _notified_by_insert(database_url)


async def test_a_listening_relay_renews_its_row_before_it_lapses(database_url: str) -> None:
    presence = Presence(Queries.for_table("outbox"), "short-lived-row", ttl=0.6)
    wake, wanted, stop = asyncio.Event(), asyncio.Event(), asyncio.Event()
    wanted.set()
    task = asyncio.create_task(listen(database_url, CHANNEL, wake, wanted, stop, presence))
    try:
        await _woken(wake)
        await asyncio.sleep(presence.ttl * 3)  # unrenewed, the row would have lapsed
        assert await _listeners(database_url) == [presence.relay_id]
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)
