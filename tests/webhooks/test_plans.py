"""The sender's claim and the console's page read the live set they are about: the due
deliveries of each subscription, a tenant's dead ones; never the rest of the table (a
backlog not due yet, other tenants' dead deliveries). Checked in the plans PostgreSQL
runs, on a table with history and no fresh statistics."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.webhooks.deliveries import _CLAIM
from dispatcher.webhooks.views import dead_deliveries_query
from tests.fixtures.plans import explain

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
ROWS = 30_000

# Dead deliveries of two tenants, a backlog of one subscription not due for an hour,
# and five due deliveries of each of two subscriptions.
_FILL = text(
    """
    INSERT INTO webhook_deliveries (delivery_id, notification_id, subscription_id, tenant,
        event_type, body, status, attempts, next_attempt_at)
    SELECT 'msg_' || n, 'ntf_' || n, sub, tenant, 'breaker.opened', '{}', status, 1, at
    FROM generate_series(1, :n) AS n,
    LATERAL (SELECT
        CASE WHEN n % 3 = 0 THEN 'slow' WHEN n % 3 = 1 THEN 'ops' ELSE 'ops-2' END AS sub,
        CASE WHEN n % 3 = 2 THEN 'globex' ELSE 'acme' END AS tenant,
        CASE WHEN n % 3 = 0 OR n <= 30 THEN 'pending' ELSE 'dead' END AS status,
        CASE WHEN n <= 30 THEN now() - interval '1 second'
             ELSE now() + interval '1 hour' END AS at) AS v
    """
)


async def test_a_claim_reads_each_subscriptions_due_rows_only(sessions: Sessions) -> None:
    async with sessions() as session, session.begin():
        await session.execute(_FILL, {"n": ROWS})
    params = {
        "ids": ["slow", "ops", "ops-2"],
        "rooms": [4, 4, 4],
        "limit": 8,
        "lease": 60.0,
        "owner": "test",
    }
    async with sessions() as session, session.begin():
        plan = await explain(session, _CLAIM.text, params)
    assert "ix_webhook_deliveries_due" in plan.indexes
    assert "webhook_deliveries" not in plan.seq_scans
    # Each subscription's due rows (ten in all here) and their updates: not the
    # 10,000-row backlog that is not due, nor the dead.
    assert plan.rows_examined <= 100, plan.rows_examined


async def test_a_page_of_dead_deliveries_reads_the_tenants_own_rows_only(
    sessions: Sessions,
) -> None:
    async with sessions() as session, session.begin():
        await session.execute(_FILL, {"n": ROWS})
    async with sessions() as session:
        plan = await explain(session, dead_deliveries_query("globex", after=0, limit=51))
        page = (await session.execute(dead_deliveries_query("globex", after=0, limit=51))).all()
    assert len(page) == 51
    assert "ix_webhook_deliveries_dead" in plan.indexes
    assert plan.seq_scans == set()
    assert plan.rows_examined <= 51 * 2, plan.rows_examined
