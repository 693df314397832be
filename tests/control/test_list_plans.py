"""A page of a list reads its own rows, wherever it is in the list and however long the
history: the approval inbox with and without a status, the escalation queue as the API,
the console and the CLI (every tenant's) read it, each on its first page and on a page
five hundred rows in, in the plan PostgreSQL runs on 50,000 calls of history. An OFFSET
page would read the five hundred rows before it; one ORDER BY a CASE of the status,
every row of the tenant."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.states import ApprovalStatus, EscalationStatus
from dispatcher.views import queues
from dispatcher.views.cursors import Position
from tests.fixtures.history import TENANTS
from tests.fixtures.plans import Plan, explain

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
PAGE = 51  # a page and the one row that says another follows
DEEP = 500
SCAN = len(TENANTS) * PAGE
"""What a tenant's page of escalations may read: with three tenants of one size whose
escalations lie in created_at order on disk, the planner may read the queue of every
tenant (``ix_escalations_status``) and keep the tenant's third, cheaper by its estimate
than the tenant's own index. Still a page's worth, never the history before it."""


async def plan_of(history: Sessions, statement: Select[Any] | None) -> Plan:
    assert statement is not None
    async with history() as session:
        return await explain(session, statement)


async def nth(history: Sessions, sql: str) -> Position:
    """The position of row DEEP of a list, by its order (``sql`` selects the sort keys
    and the row's number in that order)."""
    async with history() as session:
        row = (await session.execute(text(f"SELECT * FROM ({sql}) AS l WHERE n = {DEEP}"))).one()
    return Position(row.at, row.id, getattr(row, "segment", ""))


def bounded(plan: Plan, most: int) -> None:
    assert plan.rows_examined <= most, (plan.rows_examined, most)
    assert plan.seq_scans == set()


@pytest.mark.parametrize("status", [None, ApprovalStatus.APPROVED], ids=["all", "approved"])
async def test_a_page_of_approvals_reads_one_page(
    history: Sessions, status: ApprovalStatus | None
) -> None:
    where = "" if status is None else f" AND status = '{status.value}'"
    deep = await nth(
        history,
        "SELECT expires_at AS at, approval_id AS id,"
        " row_number() OVER (ORDER BY expires_at, approval_id) AS n"
        f" FROM approvals WHERE tenant = 'acme'{where}",
    )
    for after in (None, deep):
        query = queues.approvals_query("acme", status=status, limit=PAGE, after=after)
        plan = await plan_of(history, query)
        bounded(plan, PAGE)
        async with history() as session:
            page = (await session.execute(query)).all()
        assert len(page) == PAGE
        if after is not None:
            assert (page[0].expires_at, page[0].approval_id) > (after.at, after.id)


async def test_the_pending_approvals_are_read_from_the_live_set(history: Sessions) -> None:
    plan = await plan_of(history, queues.approvals_query("acme", status=ApprovalStatus.PENDING))
    # 50 pending approvals in all (the proposed calls'), of every tenant.
    bounded(plan, 50)


async def deep_in_the_queue(history: Sessions, tenant: str | None) -> Position:
    mine = "" if tenant is None else f" WHERE tenant = '{tenant}'"
    return await nth(
        history,
        "SELECT status AS segment, created_at AS at, escalation_id AS id, row_number() OVER"
        " (ORDER BY array_position(ARRAY['open', 'acknowledged', 'resolved'], status),"
        f" created_at, escalation_id) AS n FROM escalations{mine}",
    )


@pytest.mark.parametrize("tenant", ["acme", None], ids=["api", "cli"])
async def test_a_page_of_the_whole_queue_reads_at_most_a_page_a_segment(
    history: Sessions, tenant: str | None
) -> None:
    """The API's list (a tenant's) and the CLI's (every tenant's), every status: open
    first, then acknowledged, then resolved."""
    deep = await deep_in_the_queue(history, tenant)
    assert deep.segment == "resolved"
    per_segment = PAGE if tenant is None else SCAN
    for after, segments in ((None, 3), (deep, 1)):
        query = queues.escalations_query(tenant=tenant, limit=PAGE, after=after)
        bounded(await plan_of(history, query), segments * per_segment)


async def test_the_consoles_unresolved_queue_reads_the_unresolved_escalations(
    history: Sessions,
) -> None:
    unresolved = (EscalationStatus.OPEN, EscalationStatus.ACKNOWLEDGED)
    query = queues.escalations_query(tenant="acme", status=unresolved, limit=PAGE)
    # 50 unresolved escalations of every tenant, about 17 of them acme's.
    bounded(await plan_of(history, query), 17)


async def test_a_page_of_resolved_escalations_reads_one_page(history: Sessions) -> None:
    deep = await deep_in_the_queue(history, "acme")
    for after in (None, deep):
        query = queues.escalations_query(
            tenant="acme", status=EscalationStatus.RESOLVED, limit=PAGE, after=after
        )
        bounded(await plan_of(history, query), SCAN)
