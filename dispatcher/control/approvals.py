"""Human approvals of high-risk tool calls: decided once and only once.

Intake records a call that needs approval as ``proposed`` with an ``approvals`` row
and the event ``approval.required`` (see :mod:`dispatcher.intake.service`). The approval is
bound to its call, to a hash of the call's input and to the capability's policy
version: a decision given after either changed is refused as stale.

Exactly once: :func:`decide` locks the run (``FOR KEY SHARE``, before anything else,
as the stop command does), then the approval row ``FOR UPDATE``, and acts only on a
``pending`` one, so of any number of concurrent decisions the first to get the lock
wins and every later one finds the approval closed (``approval_already_decided``).
The decision columns live on the approval row (keyed by ``approval_id``), so one
decision can never answer two approvals; CHECK constraints make "decided" and
"approved or rejected" the same thing.

Approving revalidates, in the same transaction, everything that might have changed
while the human thought: the call is still ``proposed``, its run is not stopped, its
capability still exists and is enabled, the decider holds the ``approve`` scope of the
tenant, and (``forbidSelfApproval``) did not submit the call. Then the call moves to
``authorized`` (``approval.granted``) and its dispatch command goes to the outbox.
Rejecting moves it to ``rejected`` (``approval.rejected``).

Expiry: :func:`expire_due` moves a call whose approval outlived its TTL to
``cancelled`` with ``approval.expired``. Cancelled rather than rejected, because
nobody refused it: ``rejected`` is kept for a human's refusal.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.escalations import Actor
from dispatcher.control.runs import lock_run
from dispatcher.control.statuses import approval_update
from dispatcher.db.tables import approvals, execution_events, outbox, tool_calls
from dispatcher.errors import (
    ApprovalAlreadyDecided,
    ApprovalExpired,
    ApprovalNotFound,
    ApprovalStale,
    CapabilityNotFound,
    CapabilityUnavailable,
    Forbidden,
    RunStopped,
    SelfApprovalForbidden,
)
from dispatcher.intake.service import DEFAULT_DISPATCH_TOPIC, dispatch_command, fingerprint
from dispatcher.ledger.events import DEFAULT_EVENTS_TOPIC, CallContext, EventType
from dispatcher.ledger.transitions import BulkMove, move, move_many
from dispatcher.states import ApprovalStatus
from dispatcher.states import ExecutionStatus as S

PRODUCER = "tool-dispatcher.approvals"


class DecisionRequest(BaseModel):
    """The body of ``POST /v1/approvals/{approvalId}/decision``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision: Literal["approve", "reject"]
    reason: str = Field(default="", max_length=2000)


class ApprovalView(BaseModel):
    """An approval as the API shows it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    approval_id: str
    tool_call_id: str
    run_id: str
    capability_id: str
    risk: str
    status: ApprovalStatus
    policy_version: int
    input_hash: str
    requested_by: str | None
    expires_at: datetime
    created_at: datetime
    closed_at: datetime | None
    decision: str | None
    decided_by: str | None
    decision_reason: str | None

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> ApprovalView:
        return cls.model_validate({name: row[name] for name in cls.model_fields})


async def list_approvals(
    session: AsyncSession,
    *,
    tenant: str,
    status: ApprovalStatus | None = None,
    limit: int = 100,
) -> list[ApprovalView]:
    """The tenant's approvals, those expiring soonest first."""
    query = (
        select(approvals)
        .where(approvals.c.tenant == tenant)
        .order_by(approvals.c.expires_at, approvals.c.approval_id)
        .limit(limit)
    )
    if status is not None:
        query = query.where(approvals.c.status == status.value)
    return [ApprovalView.of(r._mapping) for r in await session.execute(query)]


async def decide(
    session: AsyncSession,
    approval_id: str,
    request: DecisionRequest,
    *,
    actor: Actor,
    scopes: Collection[str],
    tenant: str,
    registry: CapabilityRegistry,
    dispatch_topic: str = DEFAULT_DISPATCH_TOPIC,
    events_topic: str | None = DEFAULT_EVENTS_TOPIC,
) -> ApprovalView:
    """Record ``request`` as the one decision of the approval, in the caller's
    transaction (see the module docstring for what is checked, and in which order).

    Raises :class:`ApprovalNotFound` (also for another tenant's), ``Forbidden``,
    :class:`ApprovalAlreadyDecided`, :class:`ApprovalExpired`, :class:`ApprovalStale`,
    :class:`RunStopped`, :class:`CapabilityUnavailable`, ``SelfApprovalForbidden``;
    a refused decision writes nothing and leaves the approval pending.
    """
    if "approve" not in scopes:
        raise Forbidden("this API key lacks the 'approve' scope", scope="approve")
    mine = (approvals.c.approval_id == approval_id, approvals.c.tenant == tenant)
    run_id = (await session.execute(select(approvals.c.run_id).where(*mine))).scalar_one_or_none()
    if run_id is None:
        raise ApprovalNotFound(approval_id)
    # The run first, like the stop command: see dispatcher.control.runs.lock_run.
    run_stopped = await lock_run(session, tenant, run_id)
    found = (
        await session.execute(
            select(approvals, (approvals.c.expires_at <= func.now()).label("lapsed"))
            .where(*mine)
            .with_for_update(of=approvals)
        )
    ).first()
    if found is None:
        raise ApprovalNotFound(approval_id)
    current = ApprovalView.of(found._mapping)
    _still_open(current, lapsed=bool(found.lapsed))
    call = (
        await session.execute(
            select(tool_calls)
            .where(tool_calls.c.tool_call_id == current.tool_call_id)
            .with_for_update()
        )
    ).one()
    approving = request.decision == "approve"
    _revalidate(current, call._mapping, actor, registry, approving, run_stopped)

    target, event, closed = (
        (S.AUTHORIZED, EventType.APPROVAL_GRANTED, ApprovalStatus.APPROVED)
        if approving
        else (S.REJECTED, EventType.APPROVAL_REJECTED, ApprovalStatus.REJECTED)
    )
    moved = await move(
        session,
        current.tool_call_id,
        expected=S.PROPOSED,
        target=target,
        event_type=event,
        producer=PRODUCER,
        events_topic=events_topic,
        fields={} if approving else {"completed_at": func.now()},
        payload={
            "approvalId": approval_id,
            "decision": request.decision,
            "reason": request.reason,
            "by": actor.as_payload(),
        },
    )
    row = (
        await session.execute(
            approval_update(current.status, closed)
            .where(approvals.c.approval_id == approval_id)
            .values(
                decision=request.decision,
                decided_by=actor.name,
                decision_reason=request.reason,
                closed_at=func.now(),
            )
            .returning(*approvals.c)
        )
    ).one()
    if approving:
        await session.execute(
            insert(outbox).values(
                dispatch_command(
                    CallContext.of(moved._mapping),
                    moved.idempotency_key,
                    topic=dispatch_topic,
                    causation_id=await last_event_id(session, current.tool_call_id),
                )
            )
        )
    return ApprovalView.of(row._mapping)


def _still_open(current: ApprovalView, *, lapsed: bool) -> None:
    if current.status is ApprovalStatus.CANCELLED:
        # Only a stop closes an approval this way.
        raise RunStopped(current.run_id)
    if current.status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED):
        raise ApprovalAlreadyDecided(current.approval_id, current.decision, current.decided_by)
    if current.status is ApprovalStatus.EXPIRED or lapsed:
        # Refused without writing: the expiry sweeper closes it (a write here would be
        # rolled back with the refusal).
        raise ApprovalExpired(current.approval_id, current.expires_at.isoformat())


def _revalidate(
    current: ApprovalView,
    call: Mapping[Any, Any],
    actor: Actor,
    registry: CapabilityRegistry,
    approving: bool,
    run_stopped: bool,
) -> None:
    try:
        capability = registry.get(current.capability_id)
    except CapabilityNotFound:
        capability = None
    # The binding first: an answer to a question that is no longer the one asked
    # answers nothing, approve or reject.
    if fingerprint(call["capability_id"], call["input"]) != current.input_hash:
        raise ApprovalStale(current.approval_id, "input")
    if capability is not None and capability.policy_version != current.policy_version:
        raise ApprovalStale(current.approval_id, "policy version")
    if not approving:
        return
    if run_stopped:
        raise RunStopped(current.run_id)
    if capability is None:
        raise CapabilityUnavailable(current.capability_id, "is no longer registered")
    if not capability.enabled:
        raise CapabilityUnavailable(current.capability_id, "is disabled")
    if (
        capability.forbid_self_approval
        and current.requested_by is not None
        and current.requested_by == actor.name
    ):
        raise SelfApprovalForbidden(current.approval_id, actor.name)


async def last_event_id(session: AsyncSession, tool_call_id: str) -> str | None:
    """The newest event of the call (visible to the caller's own transaction)."""
    found: str | None = (
        await session.execute(
            select(execution_events.c.event_id)
            .where(execution_events.c.tool_call_id == tool_call_id)
            .order_by(execution_events.c.seq.desc())
            .limit(1)
        )
    ).scalar_one_or_none()
    return found


async def expire_due(
    session: AsyncSession,
    *,
    limit: int = 500,
    events_topic: str | None = DEFAULT_EVENTS_TOPIC,
) -> list[str]:
    """Close up to ``limit`` pending approvals past their expiry, in the caller's
    transaction: each call ``proposed -> cancelled`` with ``approval.expired``.
    Returns the approval ids closed. Sweepers running at once skip each other's rows
    (``SKIP LOCKED``), and a decision in progress holds its row, so it is skipped too.
    """
    due = (
        await session.execute(
            select(approvals.c.approval_id, approvals.c.tool_call_id, approvals.c.expires_at)
            .where(
                approvals.c.status == ApprovalStatus.PENDING.value,
                approvals.c.expires_at <= func.now(),
            )
            .order_by(approvals.c.expires_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    ).all()
    if not due:
        return []
    await move_many(
        session,
        [
            BulkMove(
                r.tool_call_id,
                payload={"approvalId": r.approval_id, "expiresAt": r.expires_at.isoformat()},
            )
            for r in due
        ],
        expected=S.PROPOSED,
        target=S.CANCELLED,
        event_type=EventType.APPROVAL_EXPIRED,
        producer=PRODUCER,
        lease_owner=None,
        fields={"completed_at": func.now()},
        events_topic=events_topic,
    )
    closed = (
        await session.execute(
            approval_update(ApprovalStatus.PENDING, ApprovalStatus.EXPIRED)
            .where(approvals.c.approval_id.in_([r.approval_id for r in due]))
            .values(closed_at=func.now())
            .returning(approvals.c.approval_id)
        )
    ).scalars()
    return sorted(closed)
