"""Reads the API serves straight from recorded rows, always scoped by tenant: another
tenant's call reads exactly like a missing one. (A run's event log is read by
:func:`dispatcher.views.run_view.run_events`, which the run view folds.)"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import RowMapping, select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import approvals, tool_calls
from dispatcher.schemas import ApprovalRef


async def tool_call_row(session: AsyncSession, tenant: str, tool_call_id: str) -> RowMapping | None:
    row = (
        await session.execute(
            select(tool_calls).where(
                tool_calls.c.tool_call_id == tool_call_id, tool_calls.c.tenant == tenant
            )
        )
    ).first()
    return None if row is None else row._mapping


async def approval_refs(
    session: AsyncSession, tenant: str, tool_call_ids: Collection[str]
) -> dict[str, ApprovalRef]:
    """The approvals of these calls of ``tenant`` (at most one each), by call."""
    if not tool_call_ids:
        return {}
    rows = await session.execute(
        select(
            approvals.c.tool_call_id,
            approvals.c.approval_id,
            approvals.c.status,
            approvals.c.expires_at,
        ).where(approvals.c.tenant == tenant, approvals.c.tool_call_id.in_(list(tool_call_ids)))
    )
    return {row.tool_call_id: ApprovalRef.of(row._mapping) for row in rows}


async def approval_ref(session: AsyncSession, tenant: str, tool_call_id: str) -> ApprovalRef | None:
    return (await approval_refs(session, tenant, [tool_call_id])).get(tool_call_id)
