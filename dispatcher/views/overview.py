"""What the console's navigation and overview show: counts and ages, each read from the
rows the runtime wrote, for one tenant. Nothing here is stored: every figure is
recomputed on each read, so a reload shows exactly what the facts say now."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import approvals, escalations, outbox, tool_calls
from dispatcher.ledger.messages import tenant_rows
from dispatcher.states import ApprovalStatus, EscalationStatus, ExecutionStatus

_UNRESOLVED = (EscalationStatus.OPEN.value, EscalationStatus.ACKNOWLEDGED.value)


@dataclass(frozen=True, slots=True)
class NavCounts:
    """The two queues a human must work, counted in the navigation of every page."""

    escalations: int
    approvals: int


@dataclass(frozen=True, slots=True)
class Overview:
    by_status: dict[str, int]
    oldest_unknown_at: datetime | None
    open_escalations: int
    oldest_escalation_at: datetime | None
    pending_approvals: int
    unpublished: int
    oldest_unpublished_at: datetime | None
    dead_letters: int


async def nav_counts(session: AsyncSession, tenant: str) -> NavCounts:
    open_escalations = (
        select(func.count())
        .select_from(escalations)
        .where(escalations.c.tenant == tenant, escalations.c.status.in_(_UNRESOLVED))
        .scalar_subquery()
    )
    pending = (
        select(func.count())
        .select_from(approvals)
        .where(approvals.c.tenant == tenant, approvals.c.status == ApprovalStatus.PENDING.value)
        .scalar_subquery()
    )
    row = (await session.execute(select(open_escalations, pending))).one()
    return NavCounts(escalations=row[0], approvals=row[1])


async def load_overview(session: AsyncSession, tenant: str) -> Overview:
    counts = await session.execute(
        select(tool_calls.c.status, func.count())
        .where(tool_calls.c.tenant == tenant)
        .group_by(tool_calls.c.status)
    )
    by_status = {status.value: 0 for status in ExecutionStatus}
    by_status.update({status: n for status, n in counts.all()})
    # Unknown since the request was sent (the first dispatch: a re-send keeps it), as
    # the reconciler's own backlog gauge counts. Not updated_at: every lookup the
    # reconciler retries bumps it, so a call unknown for hours would look seconds old.
    unknown_since = func.coalesce(tool_calls.c.dispatched_at, tool_calls.c.created_at)
    oldest_unknown = await session.scalar(
        select(func.min(unknown_since)).where(
            tool_calls.c.tenant == tenant,
            tool_calls.c.status == ExecutionStatus.RESULT_UNKNOWN.value,
        )
    )
    esc = (
        await session.execute(
            select(func.count(), func.min(escalations.c.created_at)).where(
                escalations.c.tenant == tenant, escalations.c.status.in_(_UNRESOLVED)
            )
        )
    ).one()
    pending = await session.scalar(
        select(func.count()).where(
            approvals.c.tenant == tenant, approvals.c.status == ApprovalStatus.PENDING.value
        )
    )
    mine = tenant_rows(tenant)
    waiting = (
        await session.execute(
            select(func.count(), func.min(outbox.c.created_at)).where(
                mine, outbox.c.published_at.is_(None), outbox.c.dead_lettered_at.is_(None)
            )
        )
    ).one()
    dead = await session.scalar(
        select(func.count()).where(mine, outbox.c.dead_lettered_at.is_not(None))
    )
    return Overview(
        by_status=by_status,
        oldest_unknown_at=oldest_unknown,
        open_escalations=esc[0],
        oldest_escalation_at=esc[1],
        pending_approvals=pending or 0,
        unpublished=waiting[0],
        oldest_unpublished_at=waiting[1],
        dead_letters=dead or 0,
    )
