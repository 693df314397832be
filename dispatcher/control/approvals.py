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
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.actor import Actor
from dispatcher.control.runs import lock_run
from dispatcher.control.statuses import approval_update
from dispatcher.db.tables import approvals, tool_calls
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
from dispatcher.intake.keys import fingerprint
from dispatcher.ledger.events import EventType
from dispatcher.ledger.messages import DispatchCommand, Producer, enqueue
from dispatcher.ledger.transitions import BulkMove, move, move_many
from dispatcher.metrics import APPROVAL_DECISIONS, APPROVAL_WAIT_SECONDS
from dispatcher.schemas import ApprovalView, DecisionRequest
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import ApprovalStatus
from dispatcher.states import ExecutionStatus as S


async def decide(
    session: AsyncSession,
    approval_id: str,
    request: DecisionRequest,
    *,
    actor: Actor,
    scopes: Collection[str],
    tenant: str,
    registry: CapabilityRegistry,
    topics: Topics = DEFAULT_TOPICS,
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
    current, run_stopped = await _lock_open(session, approval_id, tenant)
    call = (
        await session.execute(
            select(tool_calls)
            .where(
                tool_calls.c.tenant == tenant,
                tool_calls.c.tool_call_id == current.tool_call_id,
            )
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
        tenant=tenant,
        expected=S.PROPOSED,
        target=target,
        event_type=event,
        producer=Producer.APPROVALS,
        topics=topics,
        fields={} if approving else {"completed_at": func.now()},
        payload={
            "approvalId": approval_id,
            "decision": request.decision,
            "reason": request.reason,
            "by": actor.as_payload(),
        },
    )
    closed_view = await _close(session, approval_id, closed, request, actor)
    if approving:
        command = DispatchCommand.build(
            moved.row._mapping, producer=Producer.APPROVALS, causation_id=moved.event_id
        )
        await enqueue(session, [command.to_outbox_row(topics)])
    if closed_view.closed_at is not None:
        _count_closed(closed, (closed_view.closed_at - closed_view.created_at).total_seconds())
    return closed_view


def _count_closed(decision: ApprovalStatus, *waits: float) -> None:
    """Approvals closed by ``decision`` and how long each waited (database clock both
    ends). In the caller's transaction, as the transitions are (see count_moves)."""
    for wait in waits:
        APPROVAL_WAIT_SECONDS.labels(decision.value).observe(wait)
    APPROVAL_DECISIONS.labels(decision.value).inc(len(waits))


async def _lock_open(
    session: AsyncSession, approval_id: str, tenant: str
) -> tuple[ApprovalView, bool]:
    """The tenant's approval, locked and still open to a decision, and whether its run
    is stopped (the run's lock is held from here on)."""
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
    return current, run_stopped


async def _close(
    session: AsyncSession,
    approval_id: str,
    closed: ApprovalStatus,
    request: DecisionRequest,
    actor: Actor,
) -> ApprovalView:
    """Record the decision on the (still pending) approval row."""
    row = (
        await session.execute(
            approval_update(ApprovalStatus.PENDING, closed)
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


async def expire_due(
    session: AsyncSession,
    *,
    limit: int = 500,
    topics: Topics = DEFAULT_TOPICS,
) -> list[str]:
    """Close up to ``limit`` pending approvals past their expiry, in the caller's
    transaction: each call ``proposed -> cancelled`` with ``approval.expired``.
    Returns the approval ids closed. Sweepers running at once skip each other's rows
    (``SKIP LOCKED``), and a decision in progress holds its row, so it is skipped too.
    """
    due = (
        await session.execute(
            select(
                approvals.c.approval_id,
                approvals.c.tool_call_id,
                approvals.c.tenant,
                approvals.c.expires_at,
            )
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
                tenant=r.tenant,
            )
            for r in due
        ],
        expected=S.PROPOSED,
        target=S.CANCELLED,
        event_type=EventType.APPROVAL_EXPIRED,
        producer=Producer.APPROVALS,
        lease_owner=None,
        fields={"completed_at": func.now()},
        topics=topics,
    )
    closed = (
        await session.execute(
            approval_update(ApprovalStatus.PENDING, ApprovalStatus.EXPIRED)
            .where(approvals.c.approval_id.in_([r.approval_id for r in due]))
            .values(closed_at=func.now())
            .returning(approvals.c.approval_id, approvals.c.closed_at - approvals.c.created_at)
        )
    ).all()
    _count_closed(ApprovalStatus.EXPIRED, *(waited.total_seconds() for _, waited in closed))
    return sorted(approval_id for approval_id, _ in closed)
