"""The run view: what a screen needs about a run, folded from its event log alone.

``GET /v1/runs/{runId}`` is :func:`fold_run` over the run's events, so the view has
one source of truth and anyone holding the log (a bus consumer, an auditor, a test)
rebuilds exactly the same answer. Nothing here is stored; the view may change shape
with the UI, the facts do not.

Execution status comes from each transition event's ``to`` (intake's own two events
say ``proposed`` / ``authorized``). Verification status is inferred from the event
type and what its payload says the provider answered (see :func:`_verification`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import execution_events
from dispatcher.errors import RunNotFound, ValidationFailed
from dispatcher.ledger.events import EventType
from dispatcher.schemas import EventView
from dispatcher.states import BUSY_STATES
from dispatcher.states import ExecutionStatus as S
from dispatcher.states import VerificationStatus as V

BUSY = BUSY_STATES
"""The system is working on a call in these states (no human is being waited for)."""


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class CallStatus(_View):
    """One call of the run, with both of its statuses."""

    tool_call_id: str
    capability_id: str | None
    status: S
    verification_status: V
    last_event_id: str
    updated_at: datetime


class PendingApproval(_View):
    approval_id: str
    tool_call_id: str
    capability_id: str | None
    risk: str
    expires_at: datetime
    requested_at: datetime


class ApprovalBanner(_View):
    """What a banner shows: the approval expiring first, and how many wait."""

    approval_id: str
    tool_call_id: str
    capability_id: str | None
    risk: str
    expires_at: datetime
    pending_count: int


class RunView(_View):
    run_id: str
    stopped: bool
    stopped_at: datetime | None
    stopped_by: dict[str, Any] | None
    stop_reason: str | None
    is_busy: bool
    can_stop: bool
    pending_approvals: list[PendingApproval]
    approval_banner: ApprovalBanner | None
    tool_calls: list[CallStatus]
    last_event_id: str | None
    event_count: int


@dataclass
class _Call:
    tool_call_id: str
    capability_id: str | None
    status: S
    verification: V
    last_event_id: str
    updated_at: datetime
    approval: PendingApproval | None = None


def _status(event: EventView, current: S | None) -> S | None:
    to = event.payload.get("to")
    if isinstance(to, str):
        return S(to)
    if event.event_type == EventType.TOOL_CALL_REQUESTED:
        return S.PROPOSED
    if event.event_type == EventType.TOOL_CALL_AUTHORIZED:
        return S.AUTHORIZED
    return current


def _verification(event: EventView, current: V) -> V:
    payload = event.payload
    kind = event.event_type
    if kind in (EventType.TOOL_CALL_REQUESTED, EventType.TOOL_CALL_RETRIED):
        return V.NOT_OBSERVED
    if kind in (EventType.TOOL_CALL_ACCEPTED, EventType.TOOL_CALL_RESULT_UNKNOWN):
        return V.PENDING
    if kind in (EventType.TOOL_CALL_COMPLETED, EventType.TOOL_CALL_COMPENSATED):
        return V.CONFIRMED_SUCCESS
    if kind == EventType.TOOL_CALL_ESCALATED:
        return V.INCONCLUSIVE
    if kind == EventType.TOOL_CALL_FAILED:
        # Only the provider's own answer confirms a failure.
        return V.CONFIRMED_FAILURE if payload.get("httpStatus") else V.NOT_OBSERVED
    if kind == EventType.TOOL_CALL_CONFIRMED:
        return _confirmed(payload)
    return current


def _confirmed(payload: Mapping[str, Any]) -> V:
    finding = payload.get("finding")  # an operator's resolution
    if finding in (V.CONFIRMED_SUCCESS, V.CONFIRMED_FAILURE):
        return V(finding)
    decision = payload.get("decision")  # the reconciler's verdict
    if decision == "confirm_success":
        return V.CONFIRMED_SUCCESS
    if decision == "confirm_failure":
        return V.CONFIRMED_FAILURE
    # A re-send's final answer: the provider's error, if any, says it failed.
    return V.CONFIRMED_SUCCESS if payload.get("error") is None else V.CONFIRMED_FAILURE


def fold_run(run_id: str, events: Iterable[EventView]) -> RunView:
    """The run's view from its events, in log order. Pure: same events, same view."""
    calls: dict[str, _Call] = {}
    stopped: EventView | None = None
    last: str | None = None
    count = 0
    for event in events:
        count += 1
        last = event.event_id
        if event.event_type == EventType.RUN_STOPPED:
            stopped = stopped or event
            continue
        call_id = event.tool_call_id
        if call_id is None:
            continue
        call = calls.get(call_id)
        status = _status(event, call.status if call else None)
        if status is None:
            continue  # a fact about a call whose creation this log does not hold
        if call is None:
            call = calls[call_id] = _Call(
                call_id, event.capability_id, status, V.NOT_OBSERVED, last, event.occurred_at
            )
        call.status = status
        call.verification = _verification(event, call.verification)
        call.last_event_id = event.event_id
        call.updated_at = event.occurred_at
        if event.event_type == EventType.APPROVAL_REQUIRED:
            call.approval = PendingApproval(
                approval_id=event.payload["approvalId"],
                tool_call_id=call_id,
                capability_id=event.capability_id,
                risk=event.payload["risk"],
                expires_at=event.payload["expiresAt"],
                requested_at=event.occurred_at,
            )
    pending = sorted(
        (c.approval for c in calls.values() if c.approval and c.status is S.PROPOSED),
        key=lambda a: (a.expires_at, a.approval_id),
    )
    banner = (
        ApprovalBanner(
            approval_id=pending[0].approval_id,
            tool_call_id=pending[0].tool_call_id,
            capability_id=pending[0].capability_id,
            risk=pending[0].risk,
            expires_at=pending[0].expires_at,
            pending_count=len(pending),
        )
        if pending
        else None
    )
    by = stopped.payload.get("by") if stopped else None
    return RunView(
        run_id=run_id,
        stopped=stopped is not None,
        stopped_at=stopped.occurred_at if stopped else None,
        stopped_by=by if isinstance(by, dict) else None,
        stop_reason=stopped.payload.get("reason") if stopped else None,
        is_busy=any(c.status in BUSY for c in calls.values()),
        can_stop=stopped is None,
        pending_approvals=pending,
        approval_banner=banner,
        tool_calls=[
            CallStatus(
                tool_call_id=c.tool_call_id,
                capability_id=c.capability_id,
                status=c.status,
                verification_status=c.verification,
                last_event_id=c.last_event_id,
                updated_at=c.updated_at,
            )
            for c in calls.values()
        ],
        last_event_id=last,
        event_count=count,
    )


async def run_events(
    session: AsyncSession,
    tenant: str,
    run_id: str,
    *,
    after: str | None = None,
    limit: int | None = None,
) -> list[EventView]:
    """The run's event log in order: all of it, or up to ``limit`` events after the
    event ``after`` (:class:`ValidationFailed` if the run has no such event)."""
    mine = (execution_events.c.tenant == tenant, execution_events.c.run_id == run_id)
    query = select(execution_events).where(*mine)
    if after is not None:
        cursor = (
            await session.execute(
                select(execution_events.c.seq).where(execution_events.c.event_id == after, *mine)
            )
        ).scalar_one_or_none()
        if cursor is None:
            raise ValidationFailed(f"no event {after!r} in this run", after=after)
        query = query.where(execution_events.c.seq > cursor)
    rows = await session.execute(query.order_by(execution_events.c.seq).limit(limit))
    return [EventView.of(r._mapping) for r in rows]


async def load_run_view(session: AsyncSession, tenant: str, run_id: str) -> RunView:
    """:func:`fold_run` over the recorded log; :class:`RunNotFound` if it is empty."""
    events = await run_events(session, tenant, run_id)
    if not events:
        raise RunNotFound(run_id)
    return fold_run(run_id, events)


def status_path(events: Iterable[EventView]) -> list[S]:
    """The statuses one call went through, in order, as its events record them."""
    path: list[S] = []
    current: S | None = None
    for event in events:
        current = _status(event, current)
        if current is not None and (not path or path[-1] != current):
            path.append(current)
    return path
