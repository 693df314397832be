"""Facts about a call that leave its execution status where it is: a request that its
effect be undone (:func:`mark_for_compensation`), and a reconciler's look that
settled nothing (:func:`schedule_next_looks`).

Each is one conditional UPDATE of ``tool_calls`` and the event that records it, in the
caller's transaction, as a move is (:mod:`dispatcher.ledger.transitions`); a call the
condition no longer matches is left alone and gets no event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Float, Integer, Text, Update, cast, column, func, update, values
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.pauses import EVERY_TENANT
from dispatcher.db.tables import tool_calls
from dispatcher.ledger.events import CallContext, EventType, event_row, record_events
from dispatcher.ledger.leases import LEASE_RELEASED
from dispatcher.ledger.messages import Producer
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import ExecutionStatus, ReconciliationStatus


async def mark_for_compensation(
    session: AsyncSession,
    tool_call_id: str,
    *,
    tenant: str,
    reason: str,
    producer: Producer,
    topics: Topics = DEFAULT_TOPICS,
) -> bool:
    """Set ``tenant``'s call's ``compensation_requested_at`` and record
    ``tool.call.compensation_requested`` with ``reason``; False, with nothing written,
    when the call is already marked or does not exist."""
    row = (
        await session.execute(
            update(tool_calls)
            .where(
                tool_calls.c.tenant == tenant,
                tool_calls.c.tool_call_id == tool_call_id,
                tool_calls.c.compensation_requested_at.is_(None),
            )
            .values(compensation_requested_at=func.now(), updated_at=func.now())
            .returning(*tool_calls.c)
        )
    ).first()
    if row is None:
        return False
    await record_events(
        session,
        [
            event_row(
                EventType.TOOL_CALL_COMPENSATION_REQUESTED,
                CallContext.of(row._mapping),
                producer=producer,
                payload={"reason": reason},
            )
        ],
        topics=topics,
    )
    return True


@dataclass(frozen=True, slots=True)
class NextLook:
    """A call to look at again after ``delay_seconds``: the version its claim left (its
    fence), what this look found (its event's payload) and the error it met, if any."""

    tool_call_id: str
    version: int
    delay_seconds: float
    evidence: Mapping[str, Any]
    error: str | None = None
    # A toolCallId is unique only within its tenant.
    tenant: str = field(kw_only=True)
    counted: bool = field(default=True, kw_only=True)
    """Whether this look counts toward the policy's attempts: one put off because its
    capability is paused does not (the outage must not escalate the call)."""


async def schedule_next_looks(
    session: AsyncSession,
    looks: Sequence[NextLook],
    *,
    owner: str,
    expected: Iterable[ExecutionStatus],
    producer: Producer,
    topics: Topics,
) -> list[str]:
    """Count the attempt, schedule each call's next look and release ``owner``'s lease
    on it, its status unchanged, and record ``tool.call.reconcile_attempted`` for it
    (the log keeps every look and its answer). Fenced by the lease, each look's version
    and ``expected``; returns the calls put off."""
    if not looks:
        return []
    rows = values(
        column("tenant", Text),
        column("tool_call_id", Text),
        column("fence_version", Integer),
        column("delay", Float),
        column("error", Text),
        column("step", Integer),
        name="v",
    ).data(
        [
            (n.tenant, n.tool_call_id, n.version, n.delay_seconds, n.error, int(n.counted))
            for n in looks
        ]
    )
    updated = await session.execute(
        update(tool_calls)
        .where(
            tool_calls.c.tenant == rows.c.tenant,
            tool_calls.c.tool_call_id == rows.c.tool_call_id,
            tool_calls.c.version == rows.c.fence_version,
            tool_calls.c.lease_owner == owner,
            tool_calls.c.status.in_([s.value for s in expected]),
        )
        .values(
            **LEASE_RELEASED,
            reconcile_attempts=tool_calls.c.reconcile_attempts + rows.c.step,
            next_reconcile_at=func.now()
            + func.make_interval(0, 0, 0, 0, 0, 0, cast(rows.c.delay, Float)),
            last_error=func.coalesce(cast(rows.c.error, Text), tool_calls.c.last_error),
            version=tool_calls.c.version + 1,
            updated_at=func.now(),
        )
        .returning(*tool_calls.c)
    )
    by_key = {(n.tenant, n.tool_call_id): n for n in looks}
    events = []
    for row in updated:
        look = by_key[(row.tenant, row.tool_call_id)]
        events.append(
            event_row(
                EventType.TOOL_CALL_RECONCILE_ATTEMPTED,
                CallContext.of(row._mapping),
                producer=producer,
                payload={
                    **look.evidence,
                    "attempt": row.reconcile_attempts,
                    "nextInSeconds": look.delay_seconds,
                },
            )
        )
    await record_events(session, events, topics=topics)
    return [e["tool_call_id"] for e in events]


def look_again_query(capability_id: str, tenant: str) -> Update:
    """The statement of :func:`look_again_now`."""
    where = [
        tool_calls.c.reconciliation_status == ReconciliationStatus.PENDING.value,
        # The due index's range: the calls followed up, never the history.
        tool_calls.c.next_reconcile_at > func.now(),
        tool_calls.c.capability_id == capability_id,
    ]
    if tenant != EVERY_TENANT:
        where.append(tool_calls.c.tenant == tenant)
    return update(tool_calls).where(*where).values(next_reconcile_at=func.now())


async def look_again_now(session: AsyncSession, capability_id: str, tenant: str) -> None:
    """Make due at once the follow-ups of ``capability_id``'s calls (of ``tenant``;
    ``''``: every tenant) that wait for a later look. Called when it resumes: a re-send
    or a compensation the pause put off waits for no backoff after it."""
    await session.execute(look_again_query(capability_id, tenant))
