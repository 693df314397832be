"""The queries that honour a pause read the paused or lately resumed scopes, never the
scopes ever paused: every worker asks every second or two, the reconciler every batch
and every console page once. Checked in the plans PostgreSQL runs on a database with a
year of history (a thousand scopes paused and resumed before, two paused now)."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import tool_calls
from dispatcher.ledger import pauses
from dispatcher.states import ExecutionStatus as S
from tests.fixtures.plans import explain

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
SCOPES_EVER = 1000


async def test_the_pause_queries_read_the_live_scopes_only(history: Sessions) -> None:
    statements = {
        "recently_resumed": pauses.recently_resumed_query(5),
        "paused_for": pauses.paused_for_query("acme"),
        "paused_scopes": pauses.paused_scopes_query(),
    }
    # The worker's claim filter, on the calls waiting in authorized.
    claimable = select(tool_calls.c.tool_call_id).where(
        tool_calls.c.status == S.AUTHORIZED, pauses.not_paused(tool_calls)
    )
    async with history() as session:
        plans = {
            name: await explain(session, statement)
            for name, statement in {**statements, "claimable": claimable}.items()
        }
    scopes_read = {
        name: sum(
            int(n["Actual Rows"] + n.get("Rows Removed by Filter", 0))
            * int(n.get("Actual Loops", 1))
            for n in plan.nodes()
            if n.get("Relation Name") == "capability_states"
        )
        for name, plan in plans.items()
    }
    assert {n: p.seq_scans for n, p in plans.items() if "capability_states" in p.seq_scans} == {}
    # Two scopes are paused; the claim filter probes them per call, it never scans.
    assert scopes_read["recently_resumed"] == 0
    assert scopes_read["paused_for"] <= 2
    assert scopes_read["paused_scopes"] <= 2
    assert all(found < SCOPES_EVER // 10 for found in scopes_read.values()), scopes_read
