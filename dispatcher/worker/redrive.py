"""Re-driving ``authorized`` calls whose dispatch command was lost.

The database is the source of truth, the broker is not: a broker that loses its
memory (Tansu keeps nothing across a restart; a managed cluster can lose an unflushed
partition) takes published dispatch commands with it, and the relay has already
marked their outbox rows published. Such a call stays ``authorized`` for ever unless
someone notices. :func:`redrive_stale` notices: a call ``authorized`` for longer than
a threshold, with no dispatch command still waiting in the outbox and none written
within the threshold, gets its command written again through the outbox, together
with a ``tool.call.redriven`` event (the command's cause), so the call's log says why
it was dispatched late.

Why this is safe: only an ``authorized`` call can be claimed (a conditional UPDATE),
so a command that arrives twice, or after another worker claimed the call, is
dropped by the call's state. Why it does not flood: a call is re-driven at most once
per threshold, because the command just written is itself the proof that one is on
its way (its outbox row is unpublished, then younger than the threshold).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Row, Select, func, literal, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import DISPATCH_COMMANDS, outbox, tool_calls
from dispatcher.ledger.events import CallContext, EventType, event_row, record_events
from dispatcher.ledger.messages import DispatchCommand, Producer, enqueue
from dispatcher.ledger.pauses import ScopeState, not_paused, recently_resumed
from dispatcher.metrics import REDRIVES
from dispatcher.settings import Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.tenancy import ordering_key

log = logging.getLogger(__name__)


async def redrive_stale(
    sessions: async_sessionmaker[AsyncSession],
    *,
    topics: Topics,
    older_than_seconds: float,
    known_capabilities: Collection[str] | None = None,
    limit: int = 200,
) -> list[str]:
    """Write the dispatch command again for every call ``authorized`` for longer than
    ``older_than_seconds`` whose command is neither waiting in the outbox nor younger
    than that; returns the calls re-driven.

    Calls of capabilities outside ``known_capabilities`` are left alone: a worker
    refuses to claim them, so re-emitting would only repeat the refusal. Several
    re-drivers may run at once: ``SKIP LOCKED`` gives each call to one of them, and
    the one that comes later sees the fresh outbox row.
    """
    threshold = func.now() - timedelta(seconds=older_than_seconds)
    async with sessions() as session, session.begin():
        # A paused capability's calls wait on purpose: they are re-driven when it resumes.
        rows = await _waiting(
            session, threshold, known_capabilities, limit, where=[not_paused(tool_calls)]
        )
        stale = await _without_command(session, rows, threshold, topics) if rows else []
        if stale:
            stale = await _write_again(session, stale, older_than_seconds, topics)
    # Counted once committed: a rolled-back sweep wrote no command.
    for r in stale:
        REDRIVES.labels(r.capability_id).inc()
    redriven = [r.tool_call_id for r in stale]
    if redriven:
        log.warning(
            "redrive: %d call(s) authorized for over %.0fs without a command in flight; "
            "dispatch command written again",
            len(redriven),
            older_than_seconds,
        )
    return redriven


async def _waiting(
    session: AsyncSession,
    threshold: ColumnElement[Any],
    known_capabilities: Collection[str] | None,
    limit: int,
    *,
    where: Sequence[ColumnElement[bool]] = (),
) -> list[Row[Any]]:
    """Calls authorized since before ``threshold`` (and ``where``), locked for this
    re-driver."""
    # ix_tool_calls_authorized_since holds only the calls waiting in authorized,
    # oldest first, so this reads no more than it returns (and the calls ``where``
    # leaves out: a paused capability's, for as long as it is paused).
    candidates = (
        await session.execute(
            select(tool_calls)
            .where(tool_calls.c.status == S.AUTHORIZED, tool_calls.c.updated_at < threshold, *where)
            .order_by(tool_calls.c.updated_at, tool_calls.c.tenant, tool_calls.c.tool_call_id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    ).all()
    return [
        r for r in candidates if known_capabilities is None or r.capability_id in known_capabilities
    ]


def commands_in_flight_query(
    keys: list[str], threshold: ColumnElement[Any], topics: Topics
) -> Select[Any]:
    """Which of ``keys`` (calls' ordering keys) have a dispatch command waiting in the
    outbox or written since ``threshold``.

    Read through ``ix_outbox_dispatch_commands``, the dispatch commands by key: a few
    rows a call (its first command, and one per redrive or retry), where the outbox
    holds about seven rows a call for ever (its events, up to retention). The topic
    alone names no index: it is a setting, where the message type is the code's."""
    return (
        select(outbox.c.key)
        .distinct()
        .where(
            outbox.c.key.in_(keys),
            DISPATCH_COMMANDS,
            outbox.c.topic == topics.dispatch,
            outbox.c.published_at.is_(None) | (outbox.c.created_at >= threshold),
        )
    )


async def _without_command(
    session: AsyncSession, rows: list[Row[Any]], threshold: ColumnElement[Any], topics: Topics
) -> list[Row[Any]]:
    """Those of ``rows`` with no dispatch command waiting in the outbox or younger than
    ``threshold``."""
    # A command's key is its call's (dispatcher.tenancy.ordering_key): it names both the
    # tenant and the call.
    keys = {ordering_key(r.tenant, r.tool_call_id): r for r in rows}
    found = await session.execute(commands_in_flight_query(list(keys), threshold, topics))
    covered = set(found.scalars())
    return [r for key, r in keys.items() if key not in covered]


async def _write_again(
    session: AsyncSession,
    stale: list[Row[Any]],
    older_than_seconds: float,
    topics: Topics,
    resumed_at: datetime | None = None,
) -> list[Row[Any]]:
    """A ``tool.call.redriven`` event per call and a command that names it as its cause;
    the calls written. A call whose event or command cannot be built is left out (and
    stays ``authorized``, due at the next sweep): it does not hold back the others."""
    written: list[Row[Any]] = []
    events: list[dict[str, Any]] = []
    commands: list[dict[str, Any]] = []
    for r in stale:
        try:
            event = event_row(
                EventType.TOOL_CALL_REDRIVEN,
                CallContext.of(r._mapping),
                producer=Producer.REDRIVE,
                payload={
                    "authorizedSince": r.updated_at.isoformat(),
                    "thresholdSeconds": older_than_seconds,
                    **({"resumedAt": resumed_at.isoformat()} if resumed_at else {}),
                },
            )
            command = DispatchCommand.build(
                r._mapping, producer=Producer.REDRIVE, causation_id=event["event_id"]
            ).to_outbox_row(topics)
        except Exception:
            log.exception("redrive: the command of %s could not be built", r.tool_call_id)
            continue
        written.append(r)
        events.append(event)
        commands.append(command)
    if written:
        await record_events(session, events, topics=topics)
        await enqueue(session, commands)
    return written


async def redrive_resumed(
    sessions: async_sessionmaker[AsyncSession],
    *,
    topics: Topics,
    older_than_seconds: float,
    known_capabilities: Collection[str] | None = None,
    limit: int = 500,
) -> list[str]:
    """Write the dispatch command again, at once, for every call that waited through a
    pause: of a scope resumed within ``older_than_seconds`` (later, the regular sweep
    finds any it left), authorized since before the resume, with no command since.

    Their commands were consumed while the capability was paused and dropped by the
    claim; the calls are the same, so they go with their same keys."""
    async with sessions() as session:
        scopes = await recently_resumed(session, older_than_seconds)
    redriven: list[str] = []
    for scope in scopes:
        redriven += await _drain(
            sessions, scope, topics, older_than_seconds, known_capabilities, limit
        )
    if redriven:
        log.info("resume: dispatch command written again for %d waiting call(s)", len(redriven))
    return redriven


async def _drain(
    sessions: async_sessionmaker[AsyncSession],
    scope: ScopeState,
    topics: Topics,
    older_than_seconds: float,
    known_capabilities: Collection[str] | None,
    limit: int,
) -> list[str]:
    """One resumed scope's waiting calls, a batch a transaction, oldest first."""
    if scope.resumed_at is None:
        return []
    since = literal(scope.resumed_at)
    where = [tool_calls.c.capability_id == scope.capability_id, not_paused(tool_calls)]
    if not scope.every_tenant:
        where.append(tool_calls.c.tenant == scope.tenant)
    redriven: list[str] = []
    after: tuple[datetime, str, str] | None = None
    while True:
        page = list(where)
        if after is not None:
            page.append(
                tuple_(tool_calls.c.updated_at, tool_calls.c.tenant, tool_calls.c.tool_call_id)
                > tuple_(*after)
            )
        async with sessions() as session, session.begin():
            rows = await _waiting(session, since, known_capabilities, limit, where=page)
            stale = await _without_command(session, rows, since, topics) if rows else []
            if stale:
                stale = await _write_again(
                    session, stale, older_than_seconds, topics, scope.resumed_at
                )
        for r in stale:
            REDRIVES.labels(r.capability_id).inc()
        redriven += [r.tool_call_id for r in stale]
        if len(rows) < limit:
            return redriven
        last = rows[-1]
        after = (last.updated_at, last.tenant, last.tool_call_id)
