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
settles the call. Calls in flight otherwise finish and are recorded as usual.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from sqlalchemy import bindparam, func, select, text, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.compensation import request_compensation
from dispatcher.control.escalations import Actor
from dispatcher.control.statuses import approval_update
from dispatcher.db.tables import approvals, runs, tool_calls
from dispatcher.errors import CapabilityNotFound
from dispatcher.ledger.events import DEFAULT_EVENTS_TOPIC, EventType, record_events, run_event_row
from dispatcher.ledger.transitions import BulkMove, move_many
from dispatcher.states import ApprovalStatus
from dispatcher.states import ExecutionStatus as S

PRODUCER = "tool-dispatcher.operator"
QUEUED = (S.PROPOSED, S.AUTHORIZED)
"""Not dispatched yet: a stop cancels these."""
IN_FLIGHT = (S.DISPATCHING, S.ACCEPTED, S.RESULT_UNKNOWN)
"""Maybe acting at the provider: a stop lets these finish (or asks to compensate)."""


class StopRequest(BaseModel):
    """The body of ``POST /v1/runs/{runId}/stop``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str = Field(default="", max_length=2000)


class RunRecord(BaseModel):
    """A run's row: whether, when, by whom and why it was stopped."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    run_id: str
    stopped_at: datetime | None
    stopped_by: str | None
    reason: str | None

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> RunRecord:
        return cls.model_validate({name: row[name] for name in cls.model_fields})


@dataclass(frozen=True, slots=True)
class StopOutcome:
    """What a stop did; ``already_stopped`` means an earlier stop did it all."""

    run: RunRecord
    already_stopped: bool
    cancelled: list[str] = field(default_factory=list)
    compensation_requested: list[str] = field(default_factory=list)
    in_flight: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            **self.run.model_dump(by_alias=True, mode="json"),
            "alreadyStopped": self.already_stopped,
            "cancelled": self.cancelled,
            "compensationRequested": self.compensation_requested,
            "inFlight": self.in_flight,
        }


# Both functions are in migration 0005, which says how the lock is keyed.
_LOCK_SHARED = text("SELECT stopped_at FROM stopped_runs_locked(:wanted)").bindparams(
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


async def stop_run(
    session: AsyncSession,
    *,
    tenant: str,
    run_id: str,
    actor: Actor,
    reason: str,
    registry: CapabilityRegistry,
    events_topic: str | None = DEFAULT_EVENTS_TOPIC,
) -> StopOutcome:
    """Stop the run in the caller's transaction (see the module docstring). A run
    nobody has heard of yet can be stopped too: its calls will be refused."""
    await session.execute(_LOCK_EXCLUSIVE, {"tenant": tenant, "run_id": run_id})
    await session.execute(
        pg_insert(runs).values(tenant=tenant, run_id=run_id).on_conflict_do_nothing()
    )
    where = (runs.c.tenant == tenant, runs.c.run_id == run_id)
    current = (await session.execute(select(runs).where(*where))).one()
    if current.stopped_at is not None:
        return StopOutcome(RunRecord.of(current._mapping), already_stopped=True)
    stopped = (
        await session.execute(
            update(runs)
            .where(*where)
            .values(stopped_at=func.now(), stopped_by=actor.label, reason=reason)
            .returning(*runs.c)
        )
    ).one()
    by = actor.as_payload()
    await record_events(
        session,
        [
            run_event_row(
                EventType.RUN_STOPPED,
                tenant=tenant,
                run_id=run_id,
                producer=PRODUCER,
                payload={"by": by, "reason": reason},
            )
        ],
        topic=events_topic,
    )
    # Lock order run -> approvals -> calls, as the expiry sweeper (approvals -> calls,
    # SKIP LOCKED) and a decision (run -> approval -> call) take them: no deadlock.
    await session.execute(
        select(approvals.c.approval_id)
        .where(
            approvals.c.tenant == tenant,
            approvals.c.run_id == run_id,
            approvals.c.status == ApprovalStatus.PENDING.value,
        )
        .with_for_update()
    )
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
            BulkMove(call_id, payload={"reason": reason, "by": by, "runStopped": True})
            for call_id in queued
        ],
        expected=QUEUED,
        target=S.CANCELLED,
        event_type=EventType.TOOL_CALL_CANCELLED,
        producer=PRODUCER,
        lease_owner=None,
        where=in_run,
        fields={"completed_at": func.now()},
        events_topic=events_topic,
    )
    cancelled_ids = [row.tool_call_id for row in cancelled]
    if cancelled_ids:
        await session.execute(
            approval_update(ApprovalStatus.PENDING, ApprovalStatus.CANCELLED)
            .where(approvals.c.tool_call_id.in_(cancelled_ids))
            .values(closed_at=func.now())
        )
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
                reason=f"run stopped: {reason}" if reason else "run stopped",
                producer=PRODUCER,
                events_topic=events_topic,
            )
            compensate.append(call_id)
    return StopOutcome(
        RunRecord.of(stopped._mapping),
        already_stopped=False,
        cancelled=sorted(cancelled_ids),
        compensation_requested=compensate,
        in_flight=[call_id for call_id, _ in flying],
    )
