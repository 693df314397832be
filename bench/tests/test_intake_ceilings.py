"""The intake benchmark's ceilings write what ``submit()`` writes (bench.intake): raw
psycopg on its own pool, and the same raw rows on the psycopg connection of a caller's
``AsyncSession`` (the floor of any library call in a session), committed with that
session. A ceiling that wrote less would flatter the ratios measured against it."""

from __future__ import annotations

from collections import Counter

import pytest
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bench.intake_modes import library_client, psycopg_client, psycopg_in_session_client
from dispatcher.db.tables import execution_events, outbox, run_summaries, tool_calls

pytestmark = pytest.mark.postgres


async def _written(sessions: async_sessionmaker[AsyncSession]) -> Counter[str]:
    """Rows of each kind in the database: calls by status, events by type, messages by
    topic, and the calls the runs' summaries count, by status."""
    async with sessions() as session:
        calls = (await session.execute(select(tool_calls.c.status))).scalars()
        events = (await session.execute(select(execution_events.c.event_type))).scalars()
        topics = (await session.execute(select(outbox.c.topic))).scalars()
        counted = (
            await session.execute(select(run_summaries.c.proposed, run_summaries.c.authorized))
        ).all()
        return Counter(
            [f"call {s}" for s in calls]
            + [f"event {t}" for t in events]
            + [f"message {t}" for t in topics]
        ) + Counter(
            {
                "counted proposed": sum(p for p, _ in counted),
                "counted authorized": sum(a for _, a in counted),
            }
        )


async def test_each_ceiling_writes_the_rows_of_one_submit(
    sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    await library_client(sessions, "run-library")()
    by_submit = await _written(sessions)
    assert sum(by_submit.values()) == 1 + 2 + 3 + 1

    await psycopg_in_session_client(sessions, "run-floor")()
    assert await _written(sessions) - by_submit == by_submit

    async with AsyncConnectionPool(database_url, min_size=1, max_size=1) as pool:
        await psycopg_client(pool, "run-psycopg")()
    assert await _written(sessions) == by_submit + by_submit + by_submit
