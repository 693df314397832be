"""A reconciler's claim reads the calls it follows up and the rows it claims, whatever
the history behind them: on 50,000 calls of which 100 are followed up (50 accepted, 50
result_unknown), a claim reads about those through the due index and claims each by
its primary key, never the finished calls. Checked in the plan PostgreSQL runs, the
claim rolled back with its transaction. On a small table the planner may hash the
whole of it instead (cheaper there); with history it must not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.ledger.marks import look_again_query
from reconciler.due import claim_due_query
from tests.fixtures.history import HISTORY_CALLS, LIVE_EVERY, fill_history
from tests.fixtures.plans import explain

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
FOLLOWED_UP = 2 * HISTORY_CALLS // LIVE_EVERY
"""The accepted and result_unknown calls among the history: due an hour from now."""


@pytest.mark.parametrize("limit", [10, 500])
async def test_a_claim_reads_the_due_calls_only(
    database_url: str, sessions: Sessions, limit: int
) -> None:
    # A database of this test's own: the claim writes, even if it is rolled back.
    fill_history(database_url)
    # Everything followed up is due by then (the history's are due in an hour).
    due_by = datetime.now(UTC) + timedelta(hours=2)
    claim = claim_due_query(owner="test", limit=limit, lease_seconds=60, due_by=due_by)
    async with sessions() as session, session.begin():
        plan = await explain(session, claim)
        await session.rollback()
    claimed = min(limit, FOLLOWED_UP)
    assert "tool_calls" not in plan.seq_scans, plan.seq_scans
    assert {"ix_tool_calls_reconcile_due", "tool_calls_pkey"} <= plan.indexes, plan.indexes
    # Each claimed call picked by the due index, found by the primary key and updated
    # (three rows of the plan's count each): not the 49,900 finished calls behind them.
    assert plan.rows_examined <= 3 * claimed + 10, (plan.rows_examined, claimed)
    assert plan.root["Actual Rows"] == claimed


@pytest.mark.parametrize("tenant", ["", "acme"])
async def test_a_resume_reads_the_followed_up_calls_only(
    database_url: str, sessions: Sessions, tenant: str
) -> None:
    """What a resume makes due at once (dispatcher.ledger.marks.look_again_now) is read
    through the due index too: the calls followed up, not the history."""
    fill_history(database_url)
    statement = look_again_query("refund", tenant)
    async with sessions() as session, session.begin():
        plan = await explain(session, statement)
        await session.rollback()
    assert "tool_calls" not in plan.seq_scans, plan.seq_scans
    assert "ix_tool_calls_reconcile_due" in plan.indexes, plan.indexes
    assert plan.rows_examined <= 3 * FOLLOWED_UP + 10, (plan.rows_examined, FOLLOWED_UP)
