"""Reads the API serves straight from recorded rows, always scoped by tenant: another
tenant's call reads exactly like a missing one. (A run's event log is read by
:func:`dispatcher.views.run_view.run_events`, which the run view folds.)"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import ColumnElement, RowMapping, Table, and_, select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import approvals, escalations, execution_events, tool_calls
from dispatcher.schemas import ApprovalView, EscalationView, EventView


async def tool_call_row(session: AsyncSession, tenant: str, tool_call_id: str) -> RowMapping | None:
    return await _one(session, tool_calls, "tool_call_id", tool_call_id, tenant)


async def _one(
    session: AsyncSession, table: Table, id_column: str, value: str, tenant: str
) -> RowMapping | None:
    """The row of ``table`` whose ``id_column`` is ``value``, if it is ``tenant``'s."""
    query = select(table).where(table.c[id_column] == value, table.c.tenant == tenant)
    row = (await session.execute(query)).first()
    return None if row is None else row._mapping


# Events are stamped by the processes that write them, the call by the database: a day
# covers any difference between their clocks.
_CLOCKS = timedelta(days=1)


def events_of_call(tenant: str, tool_call_id: str) -> ColumnElement[bool]:
    """The events of one call: its key, and no earlier than the call itself. The log is
    partitioned by day, and a lookup by call alone probes every day's index; the call's
    creation bounds the days from below, which the executor prunes at run time (a
    recent call's events are then read from its few days, however long the retention).
    A call no longer in ``tool_calls`` has none."""
    created = (
        select(tool_calls.c.created_at - _CLOCKS)
        .where(tool_calls.c.tenant == tenant, tool_calls.c.tool_call_id == tool_call_id)
        .scalar_subquery()
    )
    return and_(
        execution_events.c.tenant == tenant,
        execution_events.c.tool_call_id == tool_call_id,
        execution_events.c.occurred_at >= created,
    )


async def call_events(session: AsyncSession, tenant: str, tool_call_id: str) -> list[EventView]:
    """One call's events, in the order they were recorded."""
    rows = await session.execute(
        select(execution_events)
        .where(events_of_call(tenant, tool_call_id))
        .order_by(execution_events.c.seq)
    )
    return [EventView.of(r._mapping) for r in rows]


async def escalation(
    session: AsyncSession, tenant: str, escalation_id: str
) -> EscalationView | None:
    row = await _one(session, escalations, "escalation_id", escalation_id, tenant)
    return None if row is None else EscalationView.of(row)


async def approval(session: AsyncSession, tenant: str, approval_id: str) -> ApprovalView | None:
    row = await _one(session, approvals, "approval_id", approval_id, tenant)
    return None if row is None else ApprovalView.of(row)


async def call_escalations(
    session: AsyncSession, tenant: str, tool_call_id: str
) -> list[EscalationView]:
    """Every escalation episode of one call, oldest first."""
    rows = await session.execute(
        select(escalations)
        .where(escalations.c.tenant == tenant, escalations.c.tool_call_id == tool_call_id)
        .order_by(escalations.c.episode)
    )
    return [EscalationView.of(r._mapping) for r in rows]
