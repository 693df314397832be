"""Runs and the stop command.

A stop is ordered against everything that would put a call of the run on its way by a
transaction-scoped advisory lock named after the run: intake and the approve / retry
commands take it shared (they do not block each other), the stop takes it exclusive.
So a call is either refused (the stop committed first) or visible to the stop's
cancelling statement, which runs after the lock is held. A lock rather than a row lock
keeps intake from writing a ``runs`` row for every new run: the row is written only
when a run is stopped.

Stopping a run, in one transaction: ``stopped_at`` is set once (a second stop changes
nothing), ``run.stopped`` is recorded, every call not yet dispatched (``proposed``,
``authorized``) is ``cancelled`` and its pending approval closed, and every
side-effecting call still in flight whose capability says ``onRunStopped =
"compensate"`` is marked for compensation, which the reconciler honours when it
settles the call. Calls in flight otherwise finish and are recorded as usual. The run's
summary says it was stopped (and counts its cancelled calls), written last.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Row, bindparam, func, select, text, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.actor import Actor
from dispatcher.control.compensation import request_compensation
from dispatcher.control.statuses import approval_update
from dispatcher.db.tables import approvals, runs, tool_calls
from dispatcher.errors import CapabilityNotFound
from dispatcher.ledger import summaries
from dispatcher.ledger.events import EventType, record_events, run_event_row
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.transitions import BulkMove, move_many
from dispatcher.schemas import StopResult
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import ApprovalStatus
from dispatcher.states import ExecutionStatus as S

QUEUED = (S.PROPOSED, S.AUTHORIZED)
"""Not dispatched yet: a stop cancels these."""
IN_FLIGHT = (S.DISPATCHING, S.ACCEPTED, S.RESULT_UNKNOWN)
"""Maybe acting at the provider: a stop lets these finish (or asks to compensate)."""


# Both functions are in migration 0005, which says how the lock is keyed.
_LOCK_SHARED = text("SELECT stopped_at FROM stopped_runs_locked(:wanted)").bindparams(
    bindparam("wanted", type_=JSONB)
)
_LOCK_MANY = text("SELECT tenant, run_id FROM stopped_runs_locked(:wanted)").bindparams(
    bindparam("wanted", type_=JSONB)
)
_LOCK_EXCLUSIVE = text("SELECT lock_run_exclusive(:tenant, :run_id)")


async def lock_run(session: AsyncSession, tenant: str, run_id: str) -> bool:
    """Hold the run's lock shared until the caller commits; True if it is stopped.

    A stop that comes later waits for the caller, and then sees (and cancels) whatever
    the caller queued. Take it before any row lock of the run's calls or approvals:
    the stop takes the run first too, so the two can never wait for each other."""
    wanted = [{"tenant": tenant, "run_id": run_id}]
    return (await session.execute(_LOCK_SHARED, {"wanted": wanted})).first() is not None


async def lock_runs(session: AsyncSession, wanted: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """:func:`lock_run` for many ``(tenant, runId)`` in one statement (the function
    takes them in one order, so two such callers cannot deadlock); the stopped ones."""
    if not wanted:
        return set()
    listed = [{"tenant": tenant, "run_id": run_id} for tenant, run_id in sorted(wanted)]
    found = await session.execute(_LOCK_MANY, {"wanted": listed})
    return {(r.tenant, r.run_id) for r in found}


async def stop_run(
    session: AsyncSession,
    *,
    tenant: str,
    run_id: str,
    actor: Actor,
    reason: str,
    registry: CapabilityRegistry,
    topics: Topics = DEFAULT_TOPICS,
) -> StopResult:
    """Stop the run in the caller's transaction (see the module docstring). A run
    nobody has heard of yet can be stopped too: its calls will be refused.

    The run's summary (its cancelled calls, and the stop) is written last, once every
    call row the stop locks is locked (:func:`dispatcher.ledger.summaries.deferred`)."""
    async with summaries.deferred(session):
        return await _stop(session, tenant, run_id, actor, reason, registry, topics)


async def _stop(
    session: AsyncSession,
    tenant: str,
    run_id: str,
    actor: Actor,
    reason: str,
    registry: CapabilityRegistry,
    topics: Topics,
) -> StopResult:
    current = await _take_run(session, tenant, run_id)
    where = (runs.c.tenant == tenant, runs.c.run_id == run_id)
    if current.stopped_at is not None:
        return _result(current, already_stopped=True)
    stopped = (
        await session.execute(
            update(runs)
            .where(*where)
            .values(stopped_at=func.now(), stopped_by=actor.label, reason=reason)
            .returning(*runs.c)
        )
    ).one()
    summaries.note_stopped(session, tenant, run_id)
    by = actor.as_payload()
    await record_events(
        session,
        [
            run_event_row(
                EventType.RUN_STOPPED,
                tenant=tenant,
                run_id=run_id,
                producer=Producer.OPERATOR,
                payload={"by": by, "reason": reason},
            )
        ],
        topics=topics,
    )
    # Lock order run -> approvals -> calls, as the expiry sweeper (approvals -> calls,
    # SKIP LOCKED) and a decision (run -> approval -> call) take them: no deadlock.
    await _lock_pending_approvals(session, tenant, run_id)
    in_run = (tool_calls.c.tenant == tenant, tool_calls.c.run_id == run_id)
    queued = (
        await session.execute(
            select(tool_calls.c.tool_call_id)
            .where(*in_run, tool_calls.c.status.in_([s.value for s in QUEUED]))
            .order_by(tool_calls.c.tool_call_id)
        )
    ).scalars()
    # Fenced by status alone: a call a worker claimed meanwhile is simply skipped and
    # handled below as in flight.
    cancelled = await move_many(
        session,
        [
            BulkMove(
                call_id, payload={"reason": reason, "by": by, "runStopped": True}, tenant=tenant
            )
            for call_id in queued
        ],
        expected=QUEUED,
        target=S.CANCELLED,
        event_type=EventType.TOOL_CALL_CANCELLED,
        producer=Producer.OPERATOR,
        lease_owner=None,
        where=in_run,
        fields={"completed_at": func.now()},
        topics=topics,
    )
    cancelled_ids = [m.row.tool_call_id for m in cancelled]
    await _close_approvals(session, tenant, cancelled_ids)
    flying, compensate = await _compensate_in_flight(
        session, in_run, tenant=tenant, reason=reason, registry=registry, topics=topics
    )
    return _result(
        stopped,
        already_stopped=False,
        cancelled=sorted(cancelled_ids),
        compensation_requested=compensate,
        in_flight=flying,
    )


async def _take_run(session: AsyncSession, tenant: str, run_id: str) -> Row[Any]:
    """The run's row (written if the run was never stopped), under the run's lock held
    exclusive until the caller commits."""
    await session.execute(_LOCK_EXCLUSIVE, {"tenant": tenant, "run_id": run_id})
    await session.execute(
        pg_insert(runs).values(tenant=tenant, run_id=run_id).on_conflict_do_nothing()
    )
    where = (runs.c.tenant == tenant, runs.c.run_id == run_id)
    return (await session.execute(select(runs).where(*where))).one()


async def _close_approvals(session: AsyncSession, tenant: str, cancelled: list[str]) -> None:
    """Close the pending approvals of calls the stop cancelled."""
    if cancelled:
        await session.execute(
            approval_update(ApprovalStatus.PENDING, ApprovalStatus.CANCELLED)
            .where(approvals.c.tenant == tenant, approvals.c.tool_call_id.in_(cancelled))
            .values(closed_at=func.now())
        )


async def _lock_pending_approvals(session: AsyncSession, tenant: str, run_id: str) -> None:
    await session.execute(
        select(approvals.c.approval_id)
        .where(
            approvals.c.tenant == tenant,
            approvals.c.run_id == run_id,
            approvals.c.status == ApprovalStatus.PENDING.value,
        )
        .with_for_update()
    )


async def _compensate_in_flight(
    session: AsyncSession,
    in_run: tuple[ColumnElement[bool], ...],
    *,
    tenant: str,
    reason: str,
    registry: CapabilityRegistry,
    topics: Topics,
) -> tuple[list[str], list[str]]:
    """The run's calls in flight, and those of them marked for compensation (their
    capability says ``onRunStopped = "compensate"``)."""
    flying = (
        await session.execute(
            select(tool_calls.c.tool_call_id, tool_calls.c.capability_id)
            .where(*in_run, tool_calls.c.status.in_([s.value for s in IN_FLIGHT]))
            .order_by(tool_calls.c.tool_call_id)
        )
    ).all()
    compensate: list[str] = []
    for call_id, capability_id in flying:
        try:
            capability = registry.get(capability_id)
        except CapabilityNotFound:
            continue  # nothing says how to undo it; the reconciler escalates it anyway
        if capability.side_effects and capability.on_run_stopped == "compensate":
            await request_compensation(
                session,
                call_id,
                tenant=tenant,
                reason=f"run stopped: {reason}" if reason else "run stopped",
                producer=Producer.OPERATOR,
                topics=topics,
            )
            compensate.append(call_id)
    return [call_id for call_id, _ in flying], compensate


def _result(run: Row[Any], **done: Any) -> StopResult:
    return StopResult.model_validate(
        {name: run._mapping[name] for name in ("run_id", "stopped_at", "stopped_by", "reason")}
        | done
    )
