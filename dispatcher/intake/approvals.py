"""The approval a call's view carries (``approval: {approvalId, status, expiresAt}``):
read from the approvals table, never invented."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import approvals as approvals_table
from dispatcher.schemas import ApprovalRef
from dispatcher.states import ApprovalStatus


def asked_approval(approval: dict[str, Any] | None) -> ApprovalRef | None:
    """The approval the intake statement just wrote (its row has no other values yet)."""
    if approval is None:
        return None
    return ApprovalRef(
        approval_id=approval["approval_id"],
        status=ApprovalStatus.PENDING,
        expires_at=datetime.fromisoformat(approval["expires_at"]),
    )


async def recorded_approvals(
    session: AsyncSession, calls: list[tuple[str, str]]
) -> dict[tuple[str, str], ApprovalRef]:
    """The recorded approvals of these calls (at most one each), by (tenant, toolCallId)."""
    if not calls:
        return {}
    rows = await session.execute(
        select(
            approvals_table.c.tenant,
            approvals_table.c.tool_call_id,
            approvals_table.c.approval_id,
            approvals_table.c.status,
            approvals_table.c.expires_at,
        ).where(tuple_(approvals_table.c.tenant, approvals_table.c.tool_call_id).in_(calls))
    )
    return {(r.tenant, r.tool_call_id): ApprovalRef.of(r._mapping) for r in rows}


async def approval_ref(session: AsyncSession, tenant: str, tool_call_id: str) -> ApprovalRef | None:
    """The recorded approval of one call, if it has one."""
    return (await recorded_approvals(session, [(tenant, tool_call_id)])).get((tenant, tool_call_id))
