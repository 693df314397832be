"""A bulk operation's batch reads its own calls, wherever the operation is and however
long the history: on 50,000 calls of history, the batch five hundred calls into a
retry of a tenant's failed calls (and of every tenant's, and of one capability's) is a
range of ``ix_tool_calls_operable`` in the batch's order (no sort, no OFFSET, no scan of
the calls), and the check that a call was not touched already is a probe of the
touched calls' key per call, even with 20,000 of them recorded. A batch of dead
letters is a range of their tenant's index in the same way."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.operations import dead_letters, selection
from tests.fixtures.history import TENANTS
from tests.fixtures.plans import Plan, explain

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
BATCH = 200
DEEP = 500
OP = "op_plan"
TOUCHED = 20_000


async def cursor_at(session: AsyncSession, where: str) -> dict[str, Any]:
    """The sort key of call DEEP of the operation's order, as a stored cursor."""
    row = (
        await session.execute(
            text(
                "SELECT tenant, status, updated_at, tool_call_id FROM tool_calls"
                f" WHERE status = 'failed' {where}"
                f" ORDER BY tenant, status, updated_at, tool_call_id OFFSET {DEEP} LIMIT 1"
            )
        )
    ).one()
    return selection.cursor_of(row)


def sorted_(plan: Plan) -> set[str]:
    return {n["Node Type"] for n in plan.nodes() if "Sort" in n["Node Type"]}


@pytest.mark.parametrize(
    ("stored", "where"),
    [
        ({"tenant": "acme", "status": ["failed"]}, "AND tenant = 'acme'"),
        ({"tenant": None, "status": ["failed"]}, ""),
        ({"tenant": "acme", "status": ["failed"], "capabilityId": "refund"}, "AND tenant = 'acme'"),
    ],
    ids=["tenant", "every-tenant", "capability"],
)
async def test_a_batch_is_a_range_of_the_operable_index(
    history: Sessions, stored: dict[str, Any], where: str
) -> None:
    async with history() as session:
        # Inside the transaction EXPLAIN runs in, rolled back with it: the history
        # database is shared and read-only.
        await session.execute(
            text(
                "INSERT INTO bulk_operation_calls (operation_id, tenant, tool_call_id, outcome)"
                f" SELECT '{OP}', (ARRAY{list(TENANTS)})[1 + n % 3], 'done-' || n, 'done'"
                f" FROM generate_series(1, {TOUCHED}) AS n"
            )
        )
        await session.execute(text("ANALYZE bulk_operation_calls"))
        cursor = await cursor_at(session, where)
        query = selection.batch_query(OP, stored, datetime.now().astimezone(), cursor, BATCH)
        sql = str(query.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]
        plan = await explain(session, query)
        await session.rollback()
    assert "OFFSET" not in sql.upper()
    assert plan.seq_scans == set(), plan.seq_scans
    assert "ix_tool_calls_operable" in plan.indexes, plan.indexes
    assert "bulk_operation_calls_pkey" in plan.indexes, plan.indexes
    assert sorted_(plan) == set(), "the batch is sorted rather than read in its index's order"
    calls_read = sum(
        int(n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * int(n.get("Actual Loops", 1))
        for n in plan.nodes()
        if n.get("Relation Name") == "tool_calls"
    )
    # A batch reads its own rows (a capability's batch may read the tenant's other
    # failed calls between them: the history's are all of one capability).
    assert calls_read <= 2 * BATCH, calls_read


async def test_a_batch_of_dead_letters_is_a_range_of_their_index(history: Sessions) -> None:
    async with history() as session:
        # Dead letters among the published history, rolled back with the transaction.
        await session.execute(
            text(
                "UPDATE outbox SET dead_lettered_at = now() - interval '1 minute',"
                " last_error = 'message too large' WHERE id % 100 = 7"
            )
        )
        await session.execute(text("ANALYZE outbox"))
        deep = (
            await session.execute(
                text(
                    "SELECT payload ->> 'tenant' AS tenant, id FROM outbox"
                    " WHERE dead_lettered_at IS NOT NULL AND payload ->> 'tenant' = 'acme'"
                    f" ORDER BY 1, 2 OFFSET {DEEP} LIMIT 1"
                )
            )
        ).one()
        stored = {"tenant": "acme", "lastError": "message too"}
        cursor = dead_letters.cursor_of(deep)
        query = dead_letters.batch_query(OP, stored, datetime.now().astimezone(), cursor, BATCH)
        plan = await explain(session, query)
        await session.rollback()
    assert plan.seq_scans == set(), plan.seq_scans
    assert "ix_outbox_dead_letters_tenant" in plan.indexes, plan.indexes
    assert sorted_(plan) == set()
    rows_read = sum(
        int(n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * int(n.get("Actual Loops", 1))
        for n in plan.nodes()
        if n.get("Relation Name") == "outbox"
    )
    assert rows_read <= 2 * BATCH, rows_read
