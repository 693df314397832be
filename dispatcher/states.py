"""Every status enum, and one table of allowed transitions per lifecycle.

Pure data: :mod:`dispatcher.ledger.transitions` (with :mod:`dispatcher.ledger.routed`) is
the only code that moves a call, and it asks :func:`check_transition` first;
:mod:`dispatcher.control.statuses` moves approvals and escalations by
:data:`APPROVAL_TRANSITIONS` and :data:`ESCALATION_TRANSITIONS`, and
:mod:`dispatcher.ledger.pauses` capabilities by :data:`CAPABILITY_TRANSITIONS`, and
:mod:`dispatcher.ledger.breakers` circuit breakers by :data:`BREAKER_TRANSITIONS`. The CHECK
constraints of the status columns are built from these enums (:mod:`dispatcher.db.tables`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar

from dispatcher.errors import IllegalTransition


class ExecutionStatus(StrEnum):
    """Where a tool call is in its execution (what this service did)."""

    PROPOSED = "proposed"
    """Recorded, waiting for a human approval; no dispatch command exists."""
    AUTHORIZED = "authorized"
    """Allowed to run; its dispatch command is in the outbox."""
    DISPATCHING = "dispatching"
    """Claimed by a worker (point A); the request may be leaving right now."""
    ACCEPTED = "accepted"
    """The provider took the request but has not finished it."""
    COMPLETED = "completed"
    """The provider answered with a final success."""
    FAILED = "failed"
    """The provider answered with a definitive failure (nothing happened)."""
    RESULT_UNKNOWN = "result_unknown"
    """The request may have had its effect; the reconciler must find out."""
    CONFIRMED = "confirmed"
    """The reconciler or an operator established the outcome (see verification)."""
    COMPENSATED = "compensated"
    """The effect happened and was undone by the capability's compensation."""
    ESCALATED = "escalated"
    """Nobody could find out automatically; an on-call engineer owns it."""
    REJECTED = "rejected"
    """A human refused the approval."""
    CANCELLED = "cancelled"
    """Stopped before it was dispatched."""


class VerificationStatus(StrEnum):
    """What is known about the effect in the outside world."""

    NOT_OBSERVED = "not_observed"
    PENDING = "pending"
    CONFIRMED_SUCCESS = "confirmed_success"
    CONFIRMED_FAILURE = "confirmed_failure"
    INCONCLUSIVE = "inconclusive"


class ReconciliationStatus(StrEnum):
    """Whether the reconciler still has to find out what happened."""

    NOT_NEEDED = "not_needed"
    PENDING = "pending"
    SETTLED = "settled"
    ESCALATED = "escalated"


S = ExecutionStatus

INITIAL_STATES: frozenset[ExecutionStatus] = frozenset({S.PROPOSED, S.AUTHORIZED})

TRANSITIONS: dict[ExecutionStatus, frozenset[ExecutionStatus]] = {
    S.PROPOSED: frozenset({S.AUTHORIZED, S.REJECTED, S.CANCELLED}),
    S.AUTHORIZED: frozenset({S.DISPATCHING, S.CANCELLED}),
    # dispatching -> authorized: a read-only call whose worker died is run again.
    S.DISPATCHING: frozenset({S.ACCEPTED, S.COMPLETED, S.FAILED, S.RESULT_UNKNOWN, S.AUTHORIZED}),
    # accepted -> escalated / compensated: a pending call the reconciler could not settle,
    # or whose run was stopped while the provider was still working on it.
    S.ACCEPTED: frozenset(
        {S.COMPLETED, S.FAILED, S.RESULT_UNKNOWN, S.CONFIRMED, S.ESCALATED, S.COMPENSATED}
    ),
    # completed -> compensated: the run was stopped while the effect was happening.
    S.COMPLETED: frozenset({S.COMPENSATED}),
    # result_unknown -> dispatching: the reconciler re-sends with the SAME key.
    S.RESULT_UNKNOWN: frozenset({S.CONFIRMED, S.COMPENSATED, S.ESCALATED, S.DISPATCHING}),
    # escalated -> authorized / failed -> authorized: an operator's retry command.
    S.ESCALATED: frozenset({S.CONFIRMED, S.COMPENSATED, S.AUTHORIZED}),
    S.FAILED: frozenset({S.AUTHORIZED}),
    S.CONFIRMED: frozenset(),
    S.COMPENSATED: frozenset(),
    S.REJECTED: frozenset(),
    S.CANCELLED: frozenset(),
}

TERMINAL_STATES: frozenset[ExecutionStatus] = frozenset(
    {S.COMPLETED, S.FAILED, S.CONFIRMED, S.COMPENSATED, S.REJECTED, S.CANCELLED}
)

# What a waiter waits for: a final state, or one only a human moves on from (an
# escalated call stays put until an operator resolves or retries it).
SETTLED_STATES: frozenset[ExecutionStatus] = TERMINAL_STATES | {S.ESCALATED}

# The system is working on a call in these states (no human is being waited for): a run
# with such a call is busy, in its view (dispatcher.views.run_view) and in its summary
# (run_summaries.busy) alike.
BUSY_STATES: frozenset[ExecutionStatus] = frozenset(
    {S.AUTHORIZED, S.DISPATCHING, S.ACCEPTED, S.RESULT_UNKNOWN}
)

# Every state a call can still leave, in the enum's order: the live set. It stays small
# however long the history, so what is counted or listed often is counted here
# (the partial index ix_tool_calls_in_flight holds exactly these calls); finished calls
# are counted as they finish (tool_dispatcher_transitions_total).
IN_FLIGHT_STATES: tuple[ExecutionStatus, ...] = tuple(
    s for s in ExecutionStatus if s not in TERMINAL_STATES
)


class ApprovalStatus(StrEnum):
    """Where a human approval of a call is; only ``pending`` is open."""

    PENDING = "pending"
    """Waiting for a human."""
    APPROVED = "approved"
    """A human approved; the call was authorized."""
    REJECTED = "rejected"
    """A human refused; the call was rejected."""
    EXPIRED = "expired"
    """Nobody decided in time; the call was cancelled."""
    CANCELLED = "cancelled"
    """The run was stopped first; the call was cancelled."""


A = ApprovalStatus

# Decided once: every exit of ``pending`` is final.
APPROVAL_TRANSITIONS: dict[ApprovalStatus, frozenset[ApprovalStatus]] = {
    A.PENDING: frozenset({A.APPROVED, A.REJECTED, A.EXPIRED, A.CANCELLED}),
    A.APPROVED: frozenset(),
    A.REJECTED: frozenset(),
    A.EXPIRED: frozenset(),
    A.CANCELLED: frozenset(),
}


class EscalationStatus(StrEnum):
    """Where an on-call escalation is."""

    OPEN = "open"
    """Waiting for someone to look at it."""
    ACKNOWLEDGED = "acknowledged"
    """Someone owns it."""
    RESOLVED = "resolved"
    """Settled by an operator's finding; final."""


E = EscalationStatus

ESCALATION_TRANSITIONS: dict[EscalationStatus, frozenset[EscalationStatus]] = {
    # open -> resolved: an operator may settle it without acknowledging first.
    E.OPEN: frozenset({E.ACKNOWLEDGED, E.RESOLVED}),
    E.ACKNOWLEDGED: frozenset({E.RESOLVED}),
    E.RESOLVED: frozenset(),
}


class CapabilityStatus(StrEnum):
    """Whether a capability's calls are sent, for one tenant or for every tenant."""

    ACTIVE = "active"
    PAUSED = "paused"
    """Its calls wait in ``authorized``: not claimed, not re-driven, not re-sent or
    compensated by the reconciler (its status lookups go on)."""


CAPABILITY_TRANSITIONS: dict[CapabilityStatus, frozenset[CapabilityStatus]] = {
    CapabilityStatus.ACTIVE: frozenset({CapabilityStatus.PAUSED}),
    CapabilityStatus.PAUSED: frozenset({CapabilityStatus.ACTIVE}),
}


class BreakerState(StrEnum):
    """A capability's circuit breaker, shared by every worker (``capability_breakers``)."""

    CLOSED = "closed"
    """Its calls are sent; failures are counted over a window."""
    OPEN = "open"
    """Enough failures in the window: the capability is paused for every tenant until
    the cool-down ends."""
    HALF_OPEN = "half_open"
    """The cool-down ended: a few calls go through as probes. A success closes it, a
    failure opens it again."""


BREAKER_TRANSITIONS: dict[BreakerState, frozenset[BreakerState]] = {
    # closed -> open: the threshold was reached within the window.
    BreakerState.CLOSED: frozenset({BreakerState.OPEN}),
    # open -> closed: an operator resumed the capability for every tenant.
    BreakerState.OPEN: frozenset({BreakerState.HALF_OPEN, BreakerState.CLOSED}),
    # half_open -> half_open: its probes were lost (a worker died): a new round.
    BreakerState.HALF_OPEN: frozenset(
        {BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN}
    ),
}


class OperationState(StrEnum):
    """Where an operator's bulk operation is (``bulk_operations``)."""

    RUNNING = "running"
    """Submitted; a worker works through its calls a batch at a time."""
    COMPLETED = "completed"
    """Every call its filter selected was touched (or refused); final."""
    CANCELLED = "cancelled"
    """Stopped by an operator; the calls touched before stay touched. Final."""


OPERATION_TRANSITIONS: dict[OperationState, frozenset[OperationState]] = {
    OperationState.RUNNING: frozenset({OperationState.COMPLETED, OperationState.CANCELLED}),
    OperationState.COMPLETED: frozenset(),
    OperationState.CANCELLED: frozenset(),
}


_Status = TypeVar("_Status", bound=StrEnum)


def _check(
    table: Mapping[_Status, frozenset[_Status]], subject: str, current: _Status, target: _Status
) -> None:
    if target not in table[current]:
        raise IllegalTransition(current.value, target.value, subject=subject)


def check_transition(current: ExecutionStatus, target: ExecutionStatus) -> None:
    """Raise :class:`IllegalTransition` unless the table allows ``current -> target``."""
    _check(TRANSITIONS, "a call", current, target)


def sources_of(target: ExecutionStatus) -> frozenset[ExecutionStatus]:
    """Every state from which ``target`` may be entered."""
    return frozenset(src for src, targets in TRANSITIONS.items() if target in targets)


def check_approval_transition(current: ApprovalStatus, target: ApprovalStatus) -> None:
    """Raise :class:`IllegalTransition` unless an approval may move ``current -> target``."""
    _check(APPROVAL_TRANSITIONS, "an approval", current, target)


def check_escalation_transition(current: EscalationStatus, target: EscalationStatus) -> None:
    """Raise :class:`IllegalTransition` unless an escalation may move ``current -> target``."""
    _check(ESCALATION_TRANSITIONS, "an escalation", current, target)


def breaker_sources(target: BreakerState) -> list[str]:
    """The breaker states a conditional UPDATE may move to ``target`` from."""
    return [s.value for s, targets in BREAKER_TRANSITIONS.items() if target in targets]


def operation_sources(target: OperationState) -> list[str]:
    """The operation states a conditional UPDATE may move to ``target`` from."""
    return [s.value for s, targets in OPERATION_TRANSITIONS.items() if target in targets]


class WebhookDeliveryStatus(StrEnum):
    """One notification on its way to one webhook subscription (``webhook_deliveries``).
    A delivery the receiver accepted (2xx) is deleted in the statement that learns it:
    the table keeps the live set and the dead, never the history of what was sent."""

    PENDING = "pending"
    """Not yet accepted by the receiver: due at ``next_attempt_at`` (or leased by a sender)."""
    DEAD = "dead"
    """Its attempts ran out; an operator may send it again (it goes back to pending)."""


WEBHOOK_DELIVERY_TRANSITIONS: dict[WebhookDeliveryStatus, frozenset[WebhookDeliveryStatus]] = {
    # pending -> pending: a failed attempt, due again after its backoff.
    WebhookDeliveryStatus.PENDING: frozenset(
        {WebhookDeliveryStatus.PENDING, WebhookDeliveryStatus.DEAD}
    ),
    # dead -> pending: an operator's redeliver.
    WebhookDeliveryStatus.DEAD: frozenset({WebhookDeliveryStatus.PENDING}),
}


def webhook_delivery_sources(target: WebhookDeliveryStatus) -> list[str]:
    """The delivery statuses a conditional UPDATE may move to ``target`` from."""
    return [s.value for s, to in WEBHOOK_DELIVERY_TRANSITIONS.items() if target in to]
