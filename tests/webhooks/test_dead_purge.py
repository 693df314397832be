"""Dead deliveries are kept ``dead_kept_days`` after they died, then removed by the
sender: only dead ones that died before then and were not sent again, every tenant's,
a batch a transaction, the oldest first, through their own index whatever else the
table holds (checked in the plan PostgreSQL runs, on a table with history)."""

from __future__ import annotations

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import webhook_deliveries
from dispatcher.webhooks.deliveries import purge_dead, purge_dead_statement
from tests.fixtures.plans import explain
from tests.fixtures.waiting import eventually
from tests.webhooks.conftest import sending, webhook_settings

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
DAY = 86_400.0

# ``n`` deliveries named ``<prefix><i>`` in ``status``, last changed ``age`` ago.
_ROWS = text(
    """
    INSERT INTO webhook_deliveries (delivery_id, notification_id, subscription_id, tenant,
        event_type, body, status, attempts, next_attempt_at, updated_at)
    SELECT :prefix || i, 'ntf_' || :prefix || i, 'ops', CASE WHEN i % 2 = 0 THEN 'acme'
        ELSE 'globex' END, 'breaker.opened', '{}', :status, 12, now() + interval '1 hour',
        now() - make_interval(secs => :age + i)
    FROM generate_series(1, :n) AS i
    """
)


async def add(sessions: Sessions, prefix: str, status: str, age: float, n: int) -> None:
    async with sessions() as session, session.begin():
        await session.execute(_ROWS, {"prefix": prefix, "status": status, "age": age, "n": n})


async def names(sessions: Sessions) -> set[str]:
    async with sessions() as session:
        return set((await session.execute(select(webhook_deliveries.c.delivery_id))).scalars())


async def test_only_the_dead_kept_long_enough_leave_the_oldest_first(sessions: Sessions) -> None:
    await add(sessions, "old_dead_", "dead", 31 * DAY, 5)
    await add(sessions, "new_dead_", "dead", 29 * DAY, 3)
    # Waiting that long is not dying: a pending delivery stays, whatever its age.
    await add(sessions, "old_pending_", "pending", 31 * DAY, 2)

    async with sessions() as session, session.begin():
        assert await purge_dead(session, kept_seconds=30 * DAY, limit=2) == 2
    left = await names(sessions)
    # The two that died first (the largest ages) left first.
    assert {"old_dead_5", "old_dead_4"}.isdisjoint(left)
    assert {"old_dead_1", "old_dead_2", "old_dead_3"} <= left

    async with sessions() as session, session.begin():
        assert await purge_dead(session, kept_seconds=30 * DAY, limit=500) == 3
    assert await names(sessions) == {
        *(f"new_dead_{i}" for i in (1, 2, 3)),
        *(f"old_pending_{i}" for i in (1, 2)),
    }


async def test_the_sender_removes_them_with_its_setting(
    database_url: str, sessions: Sessions
) -> None:
    await add(sessions, "old_dead_", "dead", 3 * DAY, 4)
    await add(sessions, "new_dead_", "dead", 1 * DAY, 2)
    settings = webhook_settings(database_url, [], {}, dead_kept_days=2)

    async def only_new_left() -> bool:
        return await names(sessions) == {"new_dead_1", "new_dead_2"}

    async with sending(settings):
        await eventually(only_new_left, what="the dead kept two days removed")


async def test_the_removal_reads_the_expired_dead_only(sessions: Sessions) -> None:
    # History the removal must not read: 30,000 deliveries dead within the window and
    # 10,000 pending ones as old as the expired; 20 expired dead ones.
    await add(sessions, "kept_", "dead", 1 * DAY, 30_000)
    await add(sessions, "waiting_", "pending", 40 * DAY, 10_000)
    await add(sessions, "expired_", "dead", 40 * DAY, 20)
    async with sessions() as session, session.begin():
        plan = await explain(session, purge_dead_statement(30 * DAY, 500))
    assert "ix_webhook_deliveries_dead_since" in plan.indexes
    assert plan.seq_scans == set()
    # The 20 expired rows, read by the range and again by their removal.
    assert plan.rows_examined <= 20 * 3, plan.rows_examined
