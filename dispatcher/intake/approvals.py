"""The approval a call's view carries (``approval: {approvalId, status, expiresAt}``):
read from the approvals table, never invented."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.intake.statement import PAIRS, CallerTransaction, jsonb, pairs
from dispatcher.schemas import ApprovalRef
from dispatcher.states import ApprovalStatus
from dispatcher.webhooks.events import APPROVAL_PENDING, approval_data
from dispatcher.webhooks.notify import NOTIFY_MANY, notification_rows


def asked_approval(approval: dict[str, Any] | None) -> ApprovalRef | None:
    """The approval the intake statement just wrote (its row has no other values yet)."""
    if approval is None:
        return None
    return ApprovalRef(
        approval_id=approval["approval_id"],
        status=ApprovalStatus.PENDING,
        expires_at=datetime.fromisoformat(approval["expires_at"]),
    )


# Constant text over a pair of arrays, as the replay's other reads
# (dispatcher.intake.statement): one index lookup per call.
APPROVALS_OF = (
    "SELECT a.tenant, a.tool_call_id, a.approval_id, a.status, a.expires_at"  # noqa: S608
    f" FROM {PAIRS} JOIN approvals a ON a.tenant = k.tenant AND a.tool_call_id = k.value"
)


async def recorded_approvals(
    tx: CallerTransaction, calls: list[tuple[str, str]]
) -> dict[tuple[str, str], ApprovalRef]:
    """The recorded approvals of these calls (at most one each), by (tenant, toolCallId)."""
    if not calls:
        return {}
    return {
        (row["tenant"], row["tool_call_id"]): ApprovalRef.of(row)
        for row in await tx.rows(APPROVALS_OF, pairs(calls))
    }


async def approval_ref(session: AsyncSession, tenant: str, tool_call_id: str) -> ApprovalRef | None:
    """The recorded approval of one call, if it has one."""
    refs = await recorded_approvals(await CallerTransaction.of(session), [(tenant, tool_call_id)])
    return refs.get((tenant, tool_call_id))


async def notify_pending(tx: CallerTransaction, asked: list[dict[str, Any]]) -> None:
    """``approval.pending`` for each approval intake just wrote, in its transaction (one
    statement for the batch, none when it asked for no approval)."""
    if asked:
        rows = notification_rows(APPROVAL_PENDING, [(a["tenant"], approval_data(a)) for a in asked])
        await tx.rows(NOTIFY_MANY, {"notifications": jsonb(rows)})
