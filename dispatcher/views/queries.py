"""Reads the API serves straight from recorded rows, always scoped by tenant: another
tenant's call or run reads exactly like a missing one."""

from __future__ import annotations

from typing import Any

from sqlalchemy import RowMapping, select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import execution_events, tool_calls
from dispatcher.errors import ValidationFailed


async def tool_call_row(session: AsyncSession, tenant: str, tool_call_id: str) -> RowMapping | None:
    row = (
        await session.execute(
            select(tool_calls).where(
                tool_calls.c.tool_call_id == tool_call_id, tool_calls.c.tenant == tenant
            )
        )
    ).first()
    return None if row is None else row._mapping


async def run_event_rows(
    session: AsyncSession, tenant: str, run_id: str, *, after: str | None, limit: int
) -> list[RowMapping]:
    """The run's events in log order, those after event ``after`` when given (an
    unknown ``after`` is the caller's mistake: 400, not an empty page)."""
    query: Any = select(execution_events).where(
        execution_events.c.tenant == tenant, execution_events.c.run_id == run_id
    )
    if after is not None:
        cursor = (
            await session.execute(
                select(execution_events.c.seq).where(
                    execution_events.c.event_id == after,
                    execution_events.c.tenant == tenant,
                    execution_events.c.run_id == run_id,
                )
            )
        ).scalar_one_or_none()
        if cursor is None:
            raise ValidationFailed(f"no event {after!r} in this run", after=after)
        query = query.where(execution_events.c.seq > cursor)
    rows = await session.execute(query.order_by(execution_events.c.seq).limit(limit))
    return [r._mapping for r in rows]
