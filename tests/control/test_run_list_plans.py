"""A page of a tenant's runs reads that page's summaries, and never a call: the first
page, a page far into the list, and a page of the busy runs alike, however many calls
the runs have recorded. Checked in the plan PostgreSQL runs, on a database with 50,000
calls of history (their summaries counted by :func:`dispatcher.ledger.summaries.recount`,
as after a rollout)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import run_summaries
from dispatcher.ledger import summaries
from dispatcher.views import run_list
from dispatcher.views.run_list import runs_query
from tests.fixtures.plans import explain

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
HISTORY = 50_000
PAGE = 20

# Call n: tenant n % 3, run n / 20 (2,500 runs, each with calls of every tenant: 2,500
# runs a tenant), created n seconds after the first; one run in fifty still has a call
# in flight.
_FILL = text(
    """
    INSERT INTO tool_calls (tool_call_id, tenant, run_id, capability_id, input,
        idempotency_key, provider_key, request_fingerprint, status, created_at, updated_at)
    SELECT 'tc-' || n, (ARRAY['acme', 'globex', 'initech'])[1 + n % 3], 'run-' || n / 20,
        'refund', '{}', 'k-' || n, 'p-' || n, 'fp',
        CASE WHEN (n / 20) % 50 = 7 AND n % 20 = 0 THEN 'dispatching'
             WHEN n % 7 = 0 THEN 'failed' ELSE 'completed' END,
        now() - (:n - n) * interval '1 second', now() - (:n - n) * interval '1 second'
    FROM generate_series(1, :n) AS n
    """
)


async def _pages(session: AsyncSession, tenant: str, **where: object) -> list[str]:
    """The tokens of every page after the first, walking the list by its cursors."""
    tokens: list[str] = []
    after = None
    while True:
        found = await run_list.list_runs(session, tenant, limit=PAGE + 1, after=after, **where)  # type: ignore[arg-type]
        if len(found) <= PAGE:
            return tokens
        after = run_list.run_position(found[PAGE - 1])
        tokens.append(after.token())


async def test_a_page_of_runs_reads_its_own_summaries_only(sessions: Sessions) -> None:
    async with sessions() as session, session.begin():
        await session.execute(_FILL, {"n": HISTORY})
        written = await summaries.recount(session)
    async with sessions() as session:
        tokens = await _pages(session, "acme")
        deep = run_list.parse_run_after(tokens[30])
        plans = {
            "first page": await explain(session, runs_query("acme", limit=PAGE + 1)),
            "page 32": await explain(session, runs_query("acme", limit=PAGE + 1, after=deep)),
            "busy runs": await explain(session, runs_query("acme", busy=True, limit=PAGE + 1)),
            "idle runs, deep": await explain(
                session, runs_query("acme", busy=False, limit=PAGE + 1, after=deep)
            ),
        }
        listed = await session.scalar(
            select(func.count()).select_from(run_summaries).where(run_summaries.c.tenant == "acme")
        )
        every = await session.scalar(select(func.count()).select_from(run_summaries))
    assert written == every and listed is not None and len(tokens) == (listed - 1) // PAGE
    for name, plan in plans.items():
        assert plan.seq_scans == set(), name
        assert "tool_calls" not in {n.get("Relation Name") for n in plan.nodes()}, name
        assert plan.indexes & {"ix_run_summaries_recent", "ix_run_summaries_busy"}, name
        # Its page and the one row that says whether another follows.
        assert plan.rows_examined <= PAGE + 1, (name, plan.rows_examined)
