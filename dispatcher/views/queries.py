"""Reads the API serves straight from recorded rows, always scoped by tenant: another
tenant's call reads exactly like a missing one. (A run's event log is read by
:func:`dispatcher.views.run_view.run_events`, which the run view folds.)"""

from __future__ import annotations

from sqlalchemy import RowMapping, select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import tool_calls


async def tool_call_row(session: AsyncSession, tenant: str, tool_call_id: str) -> RowMapping | None:
    row = (
        await session.execute(
            select(tool_calls).where(
                tool_calls.c.tool_call_id == tool_call_id, tool_calls.c.tenant == tenant
            )
        )
    ).first()
    return None if row is None else row._mapping
