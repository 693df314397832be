"""What the console's navigation and overview show: counts and ages, each read from the
rows the runtime wrote, for one tenant. Nothing here is stored: every figure is
recomputed on each read, so a reload shows exactly what the facts say now.

The page reloads itself every few seconds, so each figure reads the live set only,
through an index that holds about what it counts: the calls in flight
(``ix_tool_calls_in_flight``: the tenant's finished calls are never read), the
unresolved escalations and pending approvals (status-led indexes), the outbox's
unpublished rows and dead letters (partial indexes). ``tests/control/test_overview_plans.py``
holds each to that on a database with history."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.pauses import EVERY_TENANT
from dispatcher.db.tables import (
    IN_FLIGHT_CALLS,
    approvals,
    capability_states,
    escalations,
    outbox,
    tool_calls,
)
from dispatcher.ledger.messages import tenant_rows
from dispatcher.states import (
    IN_FLIGHT_STATES,
    ApprovalStatus,
    CapabilityStatus,
    EscalationStatus,
    ExecutionStatus,
)

_UNRESOLVED = (EscalationStatus.OPEN.value, EscalationStatus.ACKNOWLEDGED.value)


@dataclass(frozen=True, slots=True)
class NavCounts:
    """The two queues a human must work, counted in the navigation of every page."""

    escalations: int
    approvals: int
    paused: tuple[str, ...] = ()
    """The capabilities paused for the tenant (its own pause or every tenant's): every
    page says so, since their calls wait."""


@dataclass(frozen=True, slots=True)
class Overview:
    by_status: dict[str, int]
    """The tenant's calls in flight, per status (every in-flight status, 0 when none)."""
    oldest_unknown_at: datetime | None
    open_escalations: int
    oldest_escalation_at: datetime | None
    pending_approvals: int
    unpublished: int
    oldest_unpublished_at: datetime | None
    dead_letters: int


def nav_counts_query(tenant: str) -> Select[Any]:
    """The tenant's unresolved escalations and pending approvals, in one statement."""
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
    paused = (
        select(func.array_agg(func.distinct(capability_states.c.capability_id)))
        .where(
            capability_states.c.tenant.in_([tenant, EVERY_TENANT]),
            capability_states.c.status == CapabilityStatus.PAUSED.value,
        )
        .scalar_subquery()
    )
    return select(open_escalations, pending, paused)


async def nav_counts(session: AsyncSession, tenant: str) -> NavCounts:
    row = (await session.execute(nav_counts_query(tenant))).one()
    return NavCounts(escalations=row[0], approvals=row[1], paused=tuple(sorted(row[2] or ())))


def overview_queries(tenant: str) -> dict[str, Select[Any]]:
    """Each figure's statement for ``tenant``, by the figure's name."""
    # Unknown since the request was sent (the first dispatch: a re-send keeps it), as
    # the reconciler's own backlog gauge counts. Not updated_at: every lookup the
    # reconciler retries bumps it, so a call unknown for hours would look seconds old.
    unknown_since = func.coalesce(tool_calls.c.dispatched_at, tool_calls.c.created_at)
    mine = tenant_rows(tenant)
    return {
        "by_status": select(tool_calls.c.status, func.count())
        .where(tool_calls.c.tenant == tenant, IN_FLIGHT_CALLS)
        .group_by(tool_calls.c.status),
        # IN_FLIGHT_CALLS again, though the status alone says as much: the status is a
        # bound parameter, from which a prepared statement's generic plan cannot prove
        # that the partial index of the live set serves it.
        "oldest_unknown": select(func.min(unknown_since)).where(
            tool_calls.c.tenant == tenant,
            IN_FLIGHT_CALLS,
            tool_calls.c.status == ExecutionStatus.RESULT_UNKNOWN.value,
        ),
        "escalations": select(func.count(), func.min(escalations.c.created_at)).where(
            escalations.c.tenant == tenant, escalations.c.status.in_(_UNRESOLVED)
        ),
        "pending": select(func.count()).where(
            approvals.c.tenant == tenant, approvals.c.status == ApprovalStatus.PENDING.value
        ),
        "unpublished": select(func.count(), func.min(outbox.c.created_at)).where(
            mine, outbox.c.published_at.is_(None), outbox.c.dead_lettered_at.is_(None)
        ),
        "dead": select(func.count()).where(mine, outbox.c.dead_lettered_at.is_not(None)),
    }


async def load_overview(session: AsyncSession, tenant: str) -> Overview:
    queries = overview_queries(tenant)
    by_status = {status.value: 0 for status in IN_FLIGHT_STATES}
    by_status.update({status: n for status, n in await session.execute(queries["by_status"])})
    esc = (await session.execute(queries["escalations"])).one()
    waiting = (await session.execute(queries["unpublished"])).one()
    return Overview(
        by_status=by_status,
        oldest_unknown_at=await session.scalar(queries["oldest_unknown"]),
        open_escalations=esc[0],
        oldest_escalation_at=esc[1],
        pending_approvals=await session.scalar(queries["pending"]) or 0,
        unpublished=waiting[0],
        oldest_unpublished_at=waiting[1],
        dead_letters=await session.scalar(queries["dead"]) or 0,
    )
