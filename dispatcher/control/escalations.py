"""The on-call escalation queue: calls nobody could settle automatically.

Entering ``escalated`` and opening the escalation are one step (:func:`escalate`): the
status change, its event, the escalation record and the message announcing it on the
escalations topic commit together. ``UNIQUE (tool_call_id, episode)`` makes that
record, and so its one outbox message (:func:`dispatcher.ledger.messages.escalation_message`),
exist once per escalation episode of a call however many reconcilers race; the state
machine already lets only one of them move the call, the constraint holds even if that
ever changes.

An operator acknowledges (``open -> acknowledged``) and resolves with a finding; the
call's final status follows through the transition table (``escalated -> confirmed``
or ``compensated``), with who and why in the event log.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.control.actor import Actor
from dispatcher.control.statuses import escalation_update
from dispatcher.db.tables import escalations, execution_events, tool_calls
from dispatcher.errors import EscalationAlreadyResolved, EscalationNotFound
from dispatcher.ledger.events import CallContext, EventType, event_row, record_events
from dispatcher.ledger.leases import LEASE_RELEASED
from dispatcher.ledger.messages import EscalationMessage, Producer, enqueue, escalation_message
from dispatcher.ledger.transitions import Fence, move
from dispatcher.metrics import ESCALATIONS_OPENED
from dispatcher.schemas import EscalationView, Finding
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import EscalationStatus, ReconciliationStatus, VerificationStatus
from dispatcher.states import ExecutionStatus as S
from dispatcher.tenancy import stored_provider_key
from dispatcher.views.queries import events_of_call
from dispatcher.webhooks import notify
from dispatcher.webhooks.events import ESCALATION_OPENED


def resolution_commands(escalation_id: str) -> dict[str, list[str]]:
    """The CLI lines and HTTP calls that settle an escalation."""
    findings = [f.value for f in Finding]
    return {
        "cli": [
            f"tool-dispatcher escalations ack {escalation_id}",
            *(
                f"tool-dispatcher escalations resolve {escalation_id} --finding {f} "
                '--reason "<what you found>"'
                for f in findings
            ),
        ],
        "http": [
            f"POST /v1/escalations/{escalation_id}/acknowledge",
            *(
                f"POST /v1/escalations/{escalation_id}/resolve "
                f'{{"finding": "{f}", "reason": "<what you found>"}}'
                for f in findings
            ),
        ],
    }


async def escalate(
    session: AsyncSession,
    tool_call_id: str,
    *,
    tenant: str,
    expected: S | Iterable[S],
    reason: str,
    evidence: Mapping[str, Any],
    producer: Producer,
    fence: Fence | None = None,
    topics: Topics = DEFAULT_TOPICS,
    fields: Mapping[str, Any] | None = None,
) -> EscalationView:
    """Move the call to ``escalated`` and open its escalation, in the caller's
    transaction. ``evidence`` (e.g. the last provider answer, how to look the request
    up) is kept next to what this function gathers itself: the call, its input, its
    whole event history (every attempt and answer) and the resolving commands.
    ``fields`` are further column values for the call's UPDATE.

    Raises :class:`TransitionConflict` when someone else moved the call first (or
    ``fence`` no longer holds)."""
    escalation_id = f"esc_{uuid.uuid4().hex}"
    moved = await move(
        session,
        tool_call_id,
        tenant=tenant,
        expected=expected,
        target=S.ESCALATED,
        event_type=EventType.TOOL_CALL_ESCALATED,
        producer=producer,
        topics=topics,
        fence=fence,
        fields={
            "verification_status": VerificationStatus.INCONCLUSIVE,
            "reconciliation_status": ReconciliationStatus.ESCALATED,
            "next_reconcile_at": None,
            **LEASE_RELEASED,
            **dict(fields or {}),
        },
        payload={"reason": reason, "escalationId": escalation_id},
    )
    call = moved.row._mapping
    episode = (
        await session.execute(
            select(func.count()).where(
                escalations.c.tenant == tenant, escalations.c.tool_call_id == tool_call_id
            )
        )
    ).scalar_one() + 1
    record = {
        "escalation_id": escalation_id,
        "tool_call_id": tool_call_id,
        "tenant": call["tenant"],
        "episode": episode,
        "status": EscalationStatus.OPEN.value,
        "reason": reason,
        "evidence": await _evidence(session, escalation_id, call, evidence),
    }
    stored = (
        await session.execute(insert(escalations).values(record).returning(*escalations.c))
    ).one()
    view = EscalationView.of(stored._mapping)
    await _publish(session, view, EscalationMessage.OPENED, producer, topics)
    # The same transaction: subscribers hear of it exactly when it exists.
    await notify(session, event_type=ESCALATION_OPENED, tenant=view.tenant, data=_told(view, call))
    # In the caller's transaction, as the transitions are (see count_moves).
    ESCALATIONS_OPENED.labels(call["capability_id"]).inc()
    return view


def _told(view: EscalationView, call: Mapping[Any, Any]) -> dict[str, Any]:
    """What a webhook receiver is told of an opened escalation: ids and the reason; never
    the evidence, which holds the call's input."""
    return {
        "escalationId": view.escalation_id,
        "toolCallId": view.tool_call_id,
        "runId": call["run_id"],
        "capabilityId": call["capability_id"],
        "episode": view.episode,
        "reason": view.reason,
    }


async def _evidence(
    session: AsyncSession,
    escalation_id: str,
    call: Mapping[Any, Any],
    given: Mapping[str, Any],
) -> dict[str, Any]:
    """What an on-call engineer needs to settle the call: the call, ``given`` (the
    caller's own evidence), the call's whole event history and the resolving commands."""
    history = (
        await session.execute(
            select(
                execution_events.c.event_type,
                execution_events.c.occurred_at,
                execution_events.c.producer,
                execution_events.c.payload,
            )
            .where(events_of_call(call["tenant"], call["tool_call_id"]))
            .order_by(execution_events.c.seq)
        )
    ).all()
    return {
        "call": {
            "toolCallId": call["tool_call_id"],
            "tenant": call["tenant"],
            "runId": call["run_id"],
            "capabilityId": call["capability_id"],
            "idempotencyKey": call["idempotency_key"],
            "providerKey": stored_provider_key(
                call["tenant"], call["idempotency_key"], call["provider_key"]
            ),
            "externalRequestId": call["external_request_id"],
            "input": call["input"],
            "dispatchAttempts": call["dispatch_attempts"],
            "reconcileAttempts": call["reconcile_attempts"],
            "dispatchedAt": _iso(call["dispatched_at"]),
            "createdAt": _iso(call["created_at"]),
            "compensationRequestedAt": _iso(call["compensation_requested_at"]),
        },
        "lastError": call["last_error"],
        **dict(given),
        "history": [
            {
                "eventType": h.event_type,
                "occurredAt": _iso(h.occurred_at),
                "producer": h.producer,
                "payload": h.payload,
            }
            for h in history
        ],
        "commands": resolution_commands(escalation_id),
    }


async def acknowledge(
    session: AsyncSession,
    escalation_id: str,
    *,
    actor: Actor,
    tenant: str | None = None,
    topics: Topics = DEFAULT_TOPICS,
) -> EscalationView:
    """Take ownership of an open escalation (acknowledging twice changes nothing)."""
    current = await _locked(session, escalation_id, tenant)
    if current.status is EscalationStatus.RESOLVED:
        raise EscalationAlreadyResolved(escalation_id, current.finding)
    if current.status is EscalationStatus.ACKNOWLEDGED:
        return current
    row = (
        await session.execute(
            escalation_update(current.status, EscalationStatus.ACKNOWLEDGED)
            .where(escalations.c.escalation_id == escalation_id)
            .values(
                acknowledged_at=func.now(),
                acknowledged_by=actor.label,
            )
            .returning(*escalations.c)
        )
    ).one()
    call = await _call(session, current.tool_call_id, current.tenant)
    await record_events(
        session,
        [
            event_row(
                EventType.TOOL_CALL_ESCALATION_ACKNOWLEDGED,
                CallContext.of(call),
                producer=Producer.OPERATOR,
                payload={"escalationId": escalation_id, "by": actor.as_payload()},
            )
        ],
        topics=topics,
    )
    return EscalationView.of(row._mapping)


async def resolve(
    session: AsyncSession,
    escalation_id: str,
    *,
    finding: Finding,
    reason: str,
    actor: Actor,
    tenant: str | None = None,
    topics: Topics = DEFAULT_TOPICS,
    causation_id: str | None = None,
) -> EscalationView:
    """Settle the escalated call by an operator's finding, in the caller's transaction;
    ``causation_id`` is the call's event's cause (a bulk operation's id), if any.

    Raises :class:`EscalationNotFound` (also for another tenant's),
    :class:`EscalationAlreadyResolved` the second time, :class:`TransitionConflict`
    if the call has left ``escalated`` some other way."""
    current = await _locked(session, escalation_id, tenant)
    if current.status is EscalationStatus.RESOLVED:
        raise EscalationAlreadyResolved(escalation_id, current.finding)
    if finding is Finding.COMPENSATED:
        target, event, verified = (
            S.COMPENSATED,
            EventType.TOOL_CALL_COMPENSATED,
            VerificationStatus.CONFIRMED_SUCCESS,
        )
    else:
        target, event = S.CONFIRMED, EventType.TOOL_CALL_CONFIRMED
        verified = VerificationStatus(finding.value)
    await move(
        session,
        current.tool_call_id,
        tenant=current.tenant,
        expected=S.ESCALATED,
        target=target,
        event_type=event,
        producer=Producer.OPERATOR,
        causation_id=causation_id,
        topics=topics,
        fields={
            "verification_status": verified,
            "reconciliation_status": ReconciliationStatus.SETTLED,
            "completed_at": func.now(),
        },
        payload={
            "escalationId": escalation_id,
            "finding": finding.value,
            "reason": reason,
            "by": actor.as_payload(),
        },
    )
    row = (
        await session.execute(
            escalation_update(current.status, EscalationStatus.RESOLVED)
            .where(escalations.c.escalation_id == escalation_id)
            .values(
                resolved_at=func.now(),
                resolved_by=actor.label,
                finding=finding.value,
                resolution_reason=reason,
            )
            .returning(*escalations.c)
        )
    ).one()
    view = EscalationView.of(row._mapping)
    await _publish(session, view, EscalationMessage.RESOLVED, Producer.OPERATOR, topics)
    return view


async def _locked(session: AsyncSession, escalation_id: str, tenant: str | None) -> EscalationView:
    # Row lock: two operators resolving at once are served one after the other, and
    # the second sees the first's resolution.
    query = select(escalations).where(escalations.c.escalation_id == escalation_id)
    if tenant is not None:
        query = query.where(escalations.c.tenant == tenant)
    row = (await session.execute(query.with_for_update())).first()
    if row is None:
        raise EscalationNotFound(escalation_id)
    return EscalationView.of(row._mapping)


async def _call(session: AsyncSession, tool_call_id: str, tenant: str) -> Mapping[Any, Any]:
    row = (
        await session.execute(
            select(tool_calls).where(
                tool_calls.c.tenant == tenant, tool_calls.c.tool_call_id == tool_call_id
            )
        )
    ).one()
    return row._mapping


async def _publish(
    session: AsyncSession,
    view: EscalationView,
    kind: EscalationMessage,
    producer: Producer,
    topics: Topics,
) -> None:
    published = view.model_dump(by_alias=True, mode="json")
    await enqueue(session, [escalation_message(kind, published, producer=producer, topics=topics)])


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
