"""LISTEN for the outbox's insert trigger, so an idle relay reads the moment a row
commits instead of at its next poll.

The notification is only a hint: the relay still reads the table, and polls anyway,
so a notification lost while this connection was down costs at most one poll
interval. After every (re)connect it wakes the relay, as when listening starts (below).

Only an idle relay listens, and only while one listens do writers notify. One that is
reading a stream of commits reads again every ``read_interval`` anyway, and a
notification for each commit would cost it, PostgreSQL and every writer more than the
reads themselves: under a steady stream at 1,000 calls/s the relay's CPU per call
halved without them (bench.pipeline). Every notifying commit also takes PostgreSQL's
one lock for notifying commits and holds it until its WAL is flushed, so the writers'
commits queued behind each other instead of sharing a flush. So a listening relay
keeps a row in ``<table>_listeners`` (:class:`Presence`), entered before LISTEN and
deleted before UNLISTEN, and the insert trigger notifies only while such a row is
there.

Each time listening starts again, the relay is woken to read once more: a row committed
before LISTEN took effect notified no one, and that read sees it. A writer whose trigger
ran before the listener's row was there, and that commits after that read, notified no
one either: the relay reads once more :data:`SECOND_LOOK` seconds later, and a
transaction held open longer than that is found by the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from kit.signals import sleep_unless
from outbox_relay.queries import Queries, relay_session

log = logging.getLogger(__name__)

# Seconds a listener waits before it looks at ``stop`` and ``wanted`` again.
_BOUND = 0.5

SECOND_LOOK = 0.1
"""Seconds after listening starts that the relay is woken again, for the rows of
writers that looked for a listener just before there was one (module docstring)."""


@dataclass(frozen=True, slots=True)
class Presence:
    """A listening relay's row in ``<table>_listeners``: entered for ``ttl`` seconds and
    renewed every third of it while it listens, so a relay that died stops the
    notifications within ``ttl``."""

    queries: Queries
    relay_id: str
    ttl: float

    async def enter(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(self.queries.listening, {"relay": self.relay_id, "ttl": self.ttl})

    async def leave(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(self.queries.not_listening, {"relay": self.relay_id})


async def listen(
    conninfo: str,
    channel: str,
    wake: asyncio.Event,
    wanted: asyncio.Event,
    stop: asyncio.Event,
    presence: Presence,
    *,
    retry_delay: float = 1.0,
) -> None:
    """Set ``wake`` on every notification on ``channel`` while ``wanted`` is set (and
    twice each time listening starts), until ``stop``; ``presence`` is kept while it
    listens. Reconnects on its own."""
    while not stop.is_set():
        try:
            async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                # The relay's session: a lost write of its presence only costs a wake-up.
                await relay_session(conn)
                await _follow(conn, sql.Identifier(channel), wake, wanted, stop, presence)
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
    presence: Presence,
) -> None:
    loop = asyncio.get_running_loop()
    listening = False
    renew_at = 0.0
    try:
        while not stop.is_set():
            if not wanted.is_set():
                if listening:
                    await presence.leave(conn)
                    await conn.execute(sql.SQL("UNLISTEN {}").format(channel))
                    listening = False
                await wait_first(stop.wait(), wanted.wait(), seconds=_BOUND)
                continue
            if not listening or loop.time() >= renew_at:
                # Entered before LISTEN: a writer that sees it notifies when it commits,
                # and one that commits before LISTEN takes effect is read below.
                await presence.enter(conn)
                renew_at = loop.time() + presence.ttl / 3
            if not listening:
                await conn.execute(sql.SQL("LISTEN {}").format(channel))
                listening = True
                wake.set()
                loop.call_later(SECOND_LOOK, wake.set)
            await _notified(conn, wake, wanted, min(_BOUND, presence.ttl / 3))
    finally:
        if listening and not conn.closed:
            # Writers stop notifying now rather than when the row lapses.
            with contextlib.suppress(psycopg.Error):
                await presence.leave(conn)


async def _notified(
    conn: psycopg.AsyncConnection[Any], wake: asyncio.Event, wanted: asyncio.Event, bound: float
) -> None:
    """Wake the relay for each notification, for ``bound`` seconds at most."""
    # A bounded wait, so a stop request (or the listener row's renewal) is seen to
    # without cancelling the connection in the middle of a read.
    async with contextlib.aclosing(conn.notifies(timeout=bound)) as notifies:
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
