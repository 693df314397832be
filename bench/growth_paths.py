"""The paths a call takes through the service, as ``bench.growth`` writes its history:
each path's final row (status, verification, what was sent) and its events in order,
with the payload each event carries as SQL over the generated call ``c`` and the step
``s``.

The payloads are those the code writes (``dispatcher/intake/plan.py``,
``dispatcher/worker/claims.py`` and ``outcomes.py``, ``reconciler/record.py``,
``dispatcher/control``): ``bench/tests/test_growth_history.py`` validates a generated
history against ``docs/events`` and folds every run back to its calls' statuses. The
schema is whatever the migrations made (``--revision``); the payloads follow the code.
"""

from __future__ import annotations

from dataclasses import dataclass


def iso(expr: str) -> str:
    """SQL: ``expr`` (a timestamptz) as Python's ``datetime.isoformat()`` writes it in UTC,
    the form every event and message carries."""
    return f"""to_char(({expr}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')"""


_BY = "jsonb_build_object('name', c.decider, 'tenant', c.tenant, 'via', 'api')"
_LOOKUP = (
    "jsonb_build_object('via', 'externalRequestId', 'httpStatus', 200, 'observation', {seen},"
    " 'externalRequestId', c.ext_id, 'reversed', false)"
)
# What a worker's outcome carries (dispatcher.worker.outcomes._evidence, whose fields
# without a value are left out, and the claim it ends); the values are the path's.
_OUTCOME = (
    "jsonb_build_object('from', '[\"dispatching\"]'::jsonb, 'to', {to},"
    " 'worker', c.worker, 'claimVersion', c.claim_version) || jsonb_strip_nulls("
    "jsonb_build_object('httpStatus', c.http_status, 'attempts', c.attempts,"
    " 'externalRequestId', {ext}, 'error', {error}))"
)

PAYLOADS: dict[str, str] = {
    "requested": (
        "jsonb_build_object('requiresApproval', c.needs_approval, 'via', '{\"http\": {}}'::jsonb)"
    ),
    "authorized": '\'{"reason": "no approval required"}\'::jsonb',
    "approval_required": (
        "jsonb_build_object('approvalId', c.approval_id, 'risk', 'high',"
        f" 'expiresAt', {iso('c.created_at + interval $$1 hour$$')})"
    ),
    "approval_granted": (
        "jsonb_build_object('from', '[\"proposed\"]'::jsonb, 'to', 'authorized',"
        " 'approvalId', c.approval_id, 'decision', 'approve', 'reason', 'checked the order',"
        f" 'by', {_BY})"
    ),
    "approval_rejected": (
        "jsonb_build_object('from', '[\"proposed\"]'::jsonb, 'to', 'rejected',"
        " 'approvalId', c.approval_id, 'decision', 'reject', 'reason', 'amount too high',"
        f" 'by', {_BY})"
    ),
    "approval_expired": (
        "jsonb_build_object('from', '[\"proposed\"]'::jsonb, 'to', 'cancelled',"
        f" 'approvalId', c.approval_id, 'expiresAt', {iso('c.created_at + interval $$1 hour$$')})"
    ),
    "dispatching": (
        "jsonb_build_object('from', '[\"authorized\"]'::jsonb, 'to', 'dispatching',"
        " 'worker', c.worker, 'claimVersion', c.claim_version, 'leaseSeconds', 35.0)"
    ),
    "completed": _OUTCOME.format(to="'completed'", ext="c.ext_id", error="NULL"),
    "failed": _OUTCOME.format(to="'failed'", ext="c.ext_id", error="c.error"),
    "accepted": _OUTCOME.format(to="'accepted'", ext="c.ext_id", error="NULL"),
    "result_unknown": _OUTCOME.format(to="'result_unknown'", ext="NULL", error="c.error"),
    "reconcile_attempted": (
        f"jsonb_build_object('lookup', {_LOOKUP.format(seen=chr(39) + 'pending' + chr(39))},"
        " 'reason', 'the provider reports the request pending', 'attempt', 1,"
        " 'decision', 'retry', 'nextInSeconds', 1.0)"
    ),
    "confirmed": (
        "jsonb_build_object('from', '[\"result_unknown\", \"accepted\"]'::jsonb, 'to', 'confirmed',"
        f" 'lookup', {_LOOKUP.format(seen=chr(39) + 'succeeded' + chr(39))},"
        " 'reason', 'the provider reports success', 'attempt', 2, 'decision', 'confirm_success')"
    ),
    "escalated": (
        "jsonb_build_object('from', '[\"result_unknown\"]'::jsonb, 'to', 'escalated',"
        " 'reason', 'no definitive answer after 10 lookups', 'escalationId', c.escalation_id)"
    ),
    "escalation_acknowledged": f"jsonb_build_object('escalationId', c.escalation_id, 'by', {_BY})",
    "resolved": (
        "jsonb_build_object('from', '[\"escalated\"]'::jsonb, 'to', 'confirmed',"
        " 'escalationId', c.escalation_id, 'finding', 'confirmed_success',"
        f" 'reason', 'the provider dashboard shows the refund', 'by', {_BY})"
    ),
    "cancelled": (
        "jsonb_build_object('from', '[\"proposed\", \"authorized\"]'::jsonb, 'to', 'cancelled',"
        f" 'reason', 'abort', 'runStopped', true, 'by', {_BY})"
    ),
    "run_stopped": f"jsonb_build_object('reason', 'abort', 'by', {_BY})",
}
"""Each step kind's event payload, as SQL."""

EVENT_TYPES = {
    "requested": "tool.call.requested",
    "authorized": "tool.call.authorized",
    "approval_required": "approval.required",
    "approval_granted": "approval.granted",
    "approval_rejected": "approval.rejected",
    "approval_expired": "approval.expired",
    "dispatching": "tool.call.dispatching",
    "completed": "tool.call.completed",
    "failed": "tool.call.failed",
    "accepted": "tool.call.accepted",
    "result_unknown": "tool.call.result_unknown",
    "reconcile_attempted": "tool.call.reconcile_attempted",
    "confirmed": "tool.call.confirmed",
    "escalated": "tool.call.escalated",
    "escalation_acknowledged": "tool.call.escalation_acknowledged",
    "resolved": "tool.call.confirmed",
    "cancelled": "tool.call.cancelled",
    "run_stopped": "run.stopped",
}

_PRODUCERS = {
    "requested": "intake", "authorized": "intake", "approval_required": "intake",
    "approval_granted": "approvals", "approval_rejected": "approvals",
    "approval_expired": "approvals", "dispatching": "worker", "completed": "worker",
    "failed": "worker", "accepted": "worker", "result_unknown": "worker",
    "reconcile_attempted": "reconciler", "confirmed": "reconciler", "escalated": "reconciler",
    "escalation_acknowledged": "operator", "resolved": "operator", "cancelled": "operator",
    "run_stopped": "operator",
}  # fmt: skip


def producer(kind: str) -> str:
    return f"tool-dispatcher.{_PRODUCERS[kind]}"


CAUSED = frozenset({"authorized", "approval_required"})
"""Steps whose event names the one before it as its cause (intake's own chain)."""
COMMANDS = frozenset({"authorized", "approval_granted"})
"""Steps that write the call's dispatch command with their event."""


@dataclass(frozen=True, slots=True)
class Path:
    """One way through the service: the call's final columns and its steps, each at
    its milliseconds after the call was created."""

    name: str
    weight: int
    """Calls in 1,000 of the history (or, for a live path, calls in the live set)."""
    status: str
    verification: str
    steps: tuple[tuple[str, int], ...]
    reconciliation: str = "not_needed"
    outcome: str = "ok"
    """What the provider's answer left on the row: ok (a result), fail, none."""
    approval: str | None = None
    escalation: str | None = None
    live: bool = False


_SENT = (("requested", 0), ("authorized", 0), ("dispatching", 40))
_ASKED = (("requested", 0), ("approval_required", 0))
_UNKNOWN = (*_SENT, ("result_unknown", 5_040))
_ESCALATED = (*_UNKNOWN, ("reconcile_attempted", 7_000), ("escalated", 600_000))

HISTORY = (
    Path("completed", 843, "completed", "confirmed_success", (*_SENT, ("completed", 220))),
    Path(
        "accepted, then confirmed", 60, "confirmed", "confirmed_success",
        (*_SENT, ("accepted", 240), ("reconcile_attempted", 2_300), ("confirmed", 20_000)),
        reconciliation="settled",
    ),
    Path(
        "unknown, then confirmed", 20, "confirmed", "confirmed_success",
        (*_UNKNOWN, ("confirmed", 9_000)), reconciliation="settled",
    ),
    Path("failed", 40, "failed", "confirmed_failure", (*_SENT, ("failed", 260)), outcome="fail"),
    Path(
        "approved", 18, "completed", "confirmed_success",
        (*_ASKED, ("approval_granted", 900_000), ("dispatching", 900_040), ("completed", 900_230)),
        approval="approved",
    ),
    Path(
        "rejected", 4, "rejected", "not_observed", (*_ASKED, ("approval_rejected", 1_200_000)),
        outcome="none", approval="rejected",
    ),
    Path(
        "expired", 3, "cancelled", "not_observed", (*_ASKED, ("approval_expired", 3_600_500)),
        outcome="none", approval="expired",
    ),
    Path(
        "escalated, resolved", 9, "confirmed", "confirmed_success",
        (*_ESCALATED, ("escalation_acknowledged", 1_500_000), ("resolved", 3_300_000)),
        reconciliation="settled", outcome="none", escalation="resolved",
    ),
    Path(
        "cancelled (run stopped)", 3, "cancelled", "not_observed",
        (("requested", 0), ("authorized", 0), ("run_stopped", 2_000), ("cancelled", 2_000)),
        outcome="none",
    ),
)  # fmt: skip
"""The finished calls, in 1,000: mostly completed or confirmed, some failed, 2.5% asked
for an approval (approved, rejected, expired), 0.9% escalated and resolved by a human."""

LIVE = (
    Path("authorized, command waiting", 40, "authorized", "not_observed", _SENT[:2], live=True),
    Path("dispatching", 20, "dispatching", "not_observed", _SENT, outcome="none", live=True),
    Path(
        "accepted", 20, "accepted", "pending", (*_SENT, ("accepted", 240)),
        reconciliation="pending", live=True,
    ),
    Path(
        "result unknown", 20, "result_unknown", "pending", _UNKNOWN,
        reconciliation="pending", outcome="none", live=True,
    ),
    Path(
        "awaiting approval", 20, "proposed", "not_observed", _ASKED,
        outcome="none", approval="pending", live=True,
    ),
    Path(
        "escalated", 10, "escalated", "inconclusive", _ESCALATED,
        reconciliation="escalated", outcome="none", escalation="open", live=True,
    ),
    Path(
        "escalated, acknowledged", 5, "escalated", "inconclusive",
        (*_ESCALATED, ("escalation_acknowledged", 900_000)),
        reconciliation="escalated", outcome="none", escalation="acknowledged", live=True,
    ),
)  # fmt: skip
"""The live set, the same in the empty and the full database: calls in flight, pending
approvals, open escalations, dispatch commands not yet published."""

assert sum(p.weight for p in HISTORY) == 1000
