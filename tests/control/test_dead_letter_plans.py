"""A tenant's page of dead letters reads that tenant's dead letters, whatever the
published history behind them and whatever other tenants' dead letters: checked in the
plan PostgreSQL runs, on an outbox with history and no fresh statistics."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.views.outbox import dead_letters_query
from tests.fixtures.plans import explain

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
HISTORY = 50_000

# Published history of three tenants, then each tenant's dead letters scattered through
# it (every 97th row of acme, every 13th of globex: globex has many more).
_FILL = text(
    """
    INSERT INTO outbox (topic, key, payload, headers, published_at, dead_lettered_at)
    SELECT 'events', t || '/run-' || (n % 500), jsonb_build_object('tenant', t), '{}',
           CASE WHEN dead THEN NULL ELSE now() END, CASE WHEN dead THEN now() END
    FROM generate_series(1, :n) AS n,
         LATERAL (SELECT (ARRAY['acme', 'globex', 'initech'])[1 + n % 3] AS t) AS who,
         LATERAL (SELECT (t = 'acme' AND n % 97 = 0) OR (t = 'globex' AND n % 13 = 0)
                  AS dead) AS d
    """
)


async def test_a_page_of_dead_letters_reads_the_tenants_own_rows_only(
    sessions: Sessions,
) -> None:
    async with sessions() as session, session.begin():
        await session.execute(_FILL, {"n": HISTORY})
    async with sessions() as session:
        plan = await explain(session, dead_letters_query("acme", limit=21))
        page = (await session.execute(dead_letters_query("acme", limit=21))).all()
        live = await session.scalar(text("SELECT count(*) FROM outbox WHERE published_at IS NULL"))
    assert len(page) == 21
    assert "ix_outbox_dead_letters_tenant" in plan.indexes
    assert plan.seq_scans == set()
    # The page from the tenant's own dead letters, then what waits behind them among
    # the rows still unpublished (the live set): never the published history.
    assert live is not None and live < HISTORY // 20
    assert plan.rows_examined <= 21 + live, (plan.rows_examined, live)
