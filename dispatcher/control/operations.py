"""Commands that only bulk operations issue: cancelling one queued call, and retrying
many calls at once.

A stop cancels a whole run's queued calls (:mod:`dispatcher.control.runs`); an
operator's bulk cancel picks calls across runs by a filter, one at a time through
:func:`cancel_call`, which moves the call as the stop does (``proposed`` /
``authorized`` -> ``cancelled``, a ``tool.call.cancelled`` event with who and why,
its pending approval closed) but leaves its run running. :func:`retry_many` is
:func:`dispatcher.control.retry.retry_call` for a batch: the same checks, columns,
event and command, in a few statements instead of seven per call (a bulk retry's
process test of 5,000 calls, two worker starts included, went from 50-70 s to 29 s).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.actor import Actor
from dispatcher.control.retry import RETRIABLE, retry_of, why_not_retriable
from dispatcher.control.runs import QUEUED, lock_run, lock_runs
from dispatcher.control.statuses import approval_update
from dispatcher.db.tables import approvals, tool_calls
from dispatcher.errors import (
    CapabilityNotFound,
    DispatcherError,
    InternalError,
    RetryNotAllowed,
    RunStopped,
    ToolCallNotFound,
    TransitionConflict,
)
from dispatcher.ledger.events import EventType
from dispatcher.ledger.messages import DispatchCommand, Producer, enqueue
from dispatcher.ledger.transitions import BulkMove, Moved, move, move_many
from dispatcher.schemas import RetryRequest
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import ApprovalStatus
from dispatcher.states import ExecutionStatus as S


async def cancel_call(
    session: AsyncSession,
    tool_call_id: str,
    *,
    tenant: str,
    actor: Actor,
    reason: str,
    causation_id: str | None = None,
    topics: Topics = DEFAULT_TOPICS,
) -> Moved:
    """Cancel ``tenant``'s call if it was not dispatched yet, in the caller's
    transaction. Raises :class:`ToolCallNotFound`, or :class:`TransitionConflict` for a
    call no longer queued, before anything is written."""
    mine = (tool_calls.c.tool_call_id == tool_call_id, tool_calls.c.tenant == tenant)
    run_id = (await session.execute(select(tool_calls.c.run_id).where(*mine))).scalar_one_or_none()
    if run_id is None:
        raise ToolCallNotFound(tool_call_id)
    # Lock order run -> approval -> call, as a stop and a decision take them.
    await lock_run(session, tenant, run_id)
    pending = (approvals.c.tenant == tenant, approvals.c.tool_call_id == tool_call_id)
    await session.execute(
        select(approvals.c.approval_id)
        .where(*pending, approvals.c.status == ApprovalStatus.PENDING.value)
        .with_for_update()
    )
    status = (
        await session.execute(select(tool_calls.c.status).where(*mine).with_for_update())
    ).scalar_one()
    if S(status) not in QUEUED:
        raise TransitionConflict(
            f"tool call {tool_call_id!r} is {status}: only a call not yet dispatched is cancelled",
            toolCallId=tool_call_id,
            currentStatus=status,
        )
    moved = await move(
        session,
        tool_call_id,
        tenant=tenant,
        expected=QUEUED,
        target=S.CANCELLED,
        event_type=EventType.TOOL_CALL_CANCELLED,
        producer=Producer.OPERATOR,
        causation_id=causation_id,
        topics=topics,
        fields={"completed_at": func.now()},
        payload={"reason": reason, "by": actor.as_payload()},
    )
    await session.execute(
        approval_update(ApprovalStatus.PENDING, ApprovalStatus.CANCELLED)
        .where(*pending)
        .values(closed_at=func.now())
    )
    return moved


async def retry_many(
    session: AsyncSession,
    calls: Sequence[tuple[str, str]],
    request: RetryRequest,
    *,
    actor: Actor,
    registry: CapabilityRegistry,
    causation_id: str | None = None,
    topics: Topics = DEFAULT_TOPICS,
) -> dict[tuple[str, str], str | DispatcherError]:
    """:func:`dispatcher.control.retry.retry_call` for many ``(tenant, toolCallId)`` at
    once, in a handful of statements rather than seven per call, in the caller's
    transaction: the same checks in the same lock order (runs shared, then calls), the
    same columns, event payload and dispatch command (:func:`retry_of` is both's), each
    event caused by ``causation_id``. Each call's outcome: its event's id, or the
    refusal ``retry_call`` would have raised for it (nothing written for that call)."""
    t = tool_calls.c
    keys = tuple_(t.tenant, t.tool_call_id).in_(sorted(set(calls)))
    found = await session.execute(select(t.tenant, t.tool_call_id, t.run_id).where(keys))
    run_of = {(r.tenant, r.tool_call_id): r.run_id for r in found}
    outcome: dict[tuple[str, str], str | DispatcherError] = {
        key: ToolCallNotFound(key[1]) for key in calls if key not in run_of
    }
    stopped = await lock_runs(session, {(key[0], run) for key, run in run_of.items()})
    # Sorted by key, as move_many locks them: concurrent batches cannot deadlock.
    rows = await session.execute(
        select(tool_calls).where(keys).order_by(t.tenant, t.tool_call_id).with_for_update()
    )
    by_status: dict[S, list[BulkMove]] = {}
    common: dict[str, Any] = {}
    for row in rows.mappings():
        key, status = (row["tenant"], row["tool_call_id"]), S(row["status"])
        if status not in RETRIABLE:
            outcome[key] = RetryNotAllowed(key[1], status.value, why_not_retriable(status))
        elif (row["tenant"], row["run_id"]) in stopped:
            outcome[key] = RunStopped(row["run_id"])
        else:
            try:
                fields, payload = retry_of(row, request, actor, registry)
            except CapabilityNotFound as exc:  # a new key for a capability since removed
                outcome[key] = exc
                continue
            own = {k: fields.pop(k) for k in _PER_CALL if k in fields}
            by_status.setdefault(status, []).append(
                BulkMove(key[1], values=own, payload=payload, tenant=key[0])
            )
            common = fields
    for status, moves in by_status.items():
        # One statement per status left: each event says "from" the call's own status,
        # as a single retry's does.
        moved = await move_many(
            session,
            moves,
            expected=status,
            target=S.AUTHORIZED,
            event_type=EventType.TOOL_CALL_RETRIED,
            producer=Producer.OPERATOR,
            lease_owner=None,
            fields=common,
            causation_id=causation_id,
            topics=topics,
        )
        if len(moved) != len(moves):
            raise InternalError("a locked call slipped out of its retry")
        commands = [
            DispatchCommand.build(
                m.row._mapping, producer=Producer.OPERATOR, causation_id=m.event_id
            )
            for m in moved
        ]
        await enqueue(session, [c.to_outbox_row(topics) for c in commands])
        outcome.update({(m.row.tenant, m.row.tool_call_id): m.event_id for m in moved})
    return outcome


_PER_CALL = ("idempotency_key", "provider_key")
"""What differs between the calls of one retry: a new key is each call's own."""
