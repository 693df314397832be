"""The two queues a human works, read a keyset page at a time: the approval inbox
(expiring soonest first) and the escalation queue (open, then acknowledged, then
resolved; oldest first within each).

Each page is a range of an index in the list's own order, read after the position
where the page before ended (:mod:`dispatcher.views.cursors`): it reads its own rows,
however many approvals were decided or escalations resolved before it
(``tests/control/test_list_plans.py``). The API, the console and the CLI list through
these."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import Select, literal, select, tuple_, union_all
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import approvals, escalations
from dispatcher.schemas import ApprovalView, EscalationView
from dispatcher.states import ApprovalStatus, EscalationStatus
from dispatcher.views.cursors import Position


def approvals_query(
    tenant: str,
    *,
    status: ApprovalStatus | None = None,
    limit: int = 100,
    after: Position | None = None,
) -> Select[Any]:
    """The tenant's approvals (of one ``status``, or all), those expiring soonest first,
    the id breaking ties: after ``after`` (:func:`approval_position`), up to ``limit``.

    A range of ``ix_approvals_tenant_status`` (with a status) or
    ``ix_approvals_tenant_expiry`` (without): a page reads its own rows, however many
    approvals came and went before it."""
    order = (approvals.c.expires_at, approvals.c.approval_id)
    query = select(approvals).where(approvals.c.tenant == tenant).order_by(*order).limit(limit)
    if status is not None:
        query = query.where(approvals.c.status == status.value)
    if after is not None:
        # A row comparison: one index condition, where "a > x OR (a = x AND b > y)"
        # would not be.
        query = query.where(tuple_(*order) > tuple_(literal(after.at), literal(after.id)))
    return query


def approval_position(view: ApprovalView) -> Position:
    """Where a page that ends with ``view`` ends (the ``after`` of the next page)."""
    return Position(view.expires_at, view.approval_id)


def parse_approval_after(token: str) -> Position:
    """The position an ``after`` token of the inbox names (``ValidationFailed`` if none)."""
    return Position.parse(token)


async def list_approvals(
    session: AsyncSession,
    *,
    tenant: str,
    status: ApprovalStatus | None = None,
    limit: int = 100,
    after: Position | None = None,
) -> list[ApprovalView]:
    """The tenant's approvals, those expiring soonest first (:func:`approvals_query`)."""
    query = approvals_query(tenant, status=status, limit=limit, after=after)
    return [ApprovalView.of(r._mapping) for r in await session.execute(query)]


QUEUE_ORDER = (EscalationStatus.OPEN, EscalationStatus.ACKNOWLEDGED, EscalationStatus.RESOLVED)
"""The queue's segments, in the order it lists them."""


def escalations_query(
    *,
    tenant: str | None = None,
    status: EscalationStatus | Collection[EscalationStatus] | None = None,
    limit: int = 100,
    after: Position | None = None,
) -> Select[Any] | None:
    """Escalations (of ``tenant``, or every tenant's), open ones first, then
    acknowledged, then resolved; oldest first within each, the id breaking ties: after
    ``after`` (:func:`escalation_position`), up to ``limit``. None when no row can follow.

    One segment per status, each a range of an index in its order
    (``ix_escalations_tenant_status``, or ``ix_escalations_status`` for every tenant),
    each at most ``limit`` rows, put end to end: a page reads at most ``limit`` rows a
    segment, however many escalations were resolved before it. (One ORDER BY a CASE of
    the status would be the same order, which no index holds: every row of the tenant
    read and sorted for each page.)"""
    if status is None:
        wanted = set(QUEUE_ORDER)
    else:
        wanted = {status} if isinstance(status, EscalationStatus) else set(status)
    start = QUEUE_ORDER.index(EscalationStatus(after.segment)) if after is not None else 0
    segments = []
    for rank, segment in enumerate(QUEUE_ORDER[start:], start):
        if segment not in wanted:
            continue
        order = (escalations.c.created_at, escalations.c.escalation_id)
        part = (
            select(escalations, literal(rank).label("rank"))
            .where(escalations.c.status == segment.value)
            .order_by(*order)
            .limit(limit)
        )
        if tenant is not None:
            part = part.where(escalations.c.tenant == tenant)
        if after is not None and segment.value == after.segment:
            part = part.where(tuple_(*order) > tuple_(literal(after.at), literal(after.id)))
        segments.append(part)
    if not segments:
        return None
    queue = union_all(*segments).subquery("queue")
    return (
        select(*(queue.c[c.name] for c in escalations.c))
        .order_by(queue.c.rank, queue.c.created_at, queue.c.escalation_id)
        .limit(limit)
    )


def escalation_position(view: EscalationView) -> Position:
    """Where a page that ends with ``view`` ends (the ``after`` of the next page)."""
    return Position(view.created_at, view.escalation_id, view.status.value)


def parse_escalation_after(token: str) -> Position:
    """The position an ``after`` token of the queue names (``ValidationFailed`` if none)."""
    return Position.parse(token, segments=[s.value for s in QUEUE_ORDER])


async def list_escalations(
    session: AsyncSession,
    *,
    tenant: str | None = None,
    status: EscalationStatus | Collection[EscalationStatus] | None = None,
    limit: int = 100,
    after: Position | None = None,
) -> list[EscalationView]:
    """The queue (:func:`escalations_query`). ``tenant`` None lists every tenant's (the
    operator CLI); ``status`` is one status or several."""
    query = escalations_query(tenant=tenant, status=status, limit=limit, after=after)
    if query is None:
        return []
    return [EscalationView.of(r._mapping) for r in await session.execute(query)]
