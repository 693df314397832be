"""Operator commands on single calls: retry.

A retry is allowed only where the transition table has an operator's edge back to
``authorized``: from ``failed`` (nothing happened, the provider said so or nothing
reached it) and from ``escalated`` (a human has looked). A side-effecting call in
``result_unknown`` may have had its effect: only the reconciler may send it again,
with the same key, after asking the provider; an operator waits until it settles or
is escalated.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.actor import Actor
from dispatcher.control.runs import lock_run
from dispatcher.db.tables import tool_calls
from dispatcher.errors import RetryNotAllowed, RunStopped, ToolCallNotFound
from dispatcher.intake.approvals import approval_ref
from dispatcher.ledger.events import EventType
from dispatcher.ledger.leases import LEASE_RELEASED
from dispatcher.ledger.messages import DispatchCommand, Producer, enqueue
from dispatcher.ledger.transitions import move
from dispatcher.schemas import RetryRequest, ToolCallView
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.states import ReconciliationStatus, VerificationStatus
from dispatcher.tenancy import key_to_store

RETRIABLE = (S.FAILED, S.ESCALATED)

_WHY_NOT = {
    S.RESULT_UNKNOWN: (
        "the outcome is unknown and the effect may have happened: the reconciler must "
        "settle or escalate the call before anyone retries it"
    ),
    S.ACCEPTED: "the provider accepted the call and is still working on it",
    S.DISPATCHING: "the call is being sent right now",
    S.PROPOSED: "the call waits for its approval; decide that instead",
    S.AUTHORIZED: "the call is already queued for dispatch",
}


def why_not_retriable(status: S) -> str:
    """The reason given to an operator whose retry is refused."""
    return _WHY_NOT.get(status, f"a call in {status.value!r} is settled and cannot be retried")


def retry_of(
    call: Mapping[Any, Any], request: RetryRequest, actor: Actor, registry: CapabilityRegistry
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a retry of ``call`` (its row) writes: the call's columns, and its event's
    payload (who and why, and the key it is sent with). One place, for a single retry
    and a bulk operation's alike."""
    tool_call_id, tenant = call["tool_call_id"], call["tenant"]
    previous_key: str = call["idempotency_key"]
    # Unique by construction (a fresh uuid); the (tenant, key) constraint still guards it.
    key = (
        f"{tool_call_id}:retry:{uuid.uuid4().hex[:16]}"
        if request.new_idempotency_key
        else previous_key
    )
    fields: dict[str, Any] = {
        "idempotency_key": key,
        "verification_status": VerificationStatus.NOT_OBSERVED,
        "reconciliation_status": ReconciliationStatus.NOT_NEEDED,
        "next_reconcile_at": None,
        **LEASE_RELEASED,
        "completed_at": None,
        "last_error": None,
    }
    if request.new_idempotency_key:
        capability = registry.get(call["capability_id"])
        fields["provider_key"] = key_to_store(tenant, key, namespaced=capability.namespaces_keys)
        # The provider's id names the old request, not the one about to be sent.
        fields["external_request_id"] = None
    payload = {
        "by": actor.as_payload(),
        "reason": request.reason,
        "newIdempotencyKey": request.new_idempotency_key,
        "idempotencyKey": key,
        "previousIdempotencyKey": previous_key,
    }
    return fields, payload


async def retry_call(
    session: AsyncSession,
    tool_call_id: str,
    request: RetryRequest,
    *,
    tenant: str,
    actor: Actor,
    registry: CapabilityRegistry,
    topics: Topics = DEFAULT_TOPICS,
    causation_id: str | None = None,
) -> ToolCallView:
    """``failed`` / ``escalated`` -> ``authorized`` plus a dispatch command, in the
    caller's transaction; who and why go into the ``tool.call.retried`` event. A new
    key's provider key is qualified as ``registry`` says the capability's are.

    ``causation_id`` names what caused the retry (a bulk operation's id) as the
    event's cause; the dispatch command's cause stays the event, as always.

    Raises :class:`ToolCallNotFound` (also for another tenant's call),
    :class:`RetryNotAllowed` with the reason, or ``RunStopped``."""
    mine = (tool_calls.c.tool_call_id == tool_call_id, tool_calls.c.tenant == tenant)
    run_id = (await session.execute(select(tool_calls.c.run_id).where(*mine))).scalar_one_or_none()
    if run_id is None:
        raise ToolCallNotFound(tool_call_id)
    # The run first, like the stop command: see dispatcher.control.runs.lock_run.
    run_stopped = await lock_run(session, tenant, run_id)
    call = (await session.execute(select(tool_calls).where(*mine).with_for_update())).one()._mapping
    status = S(call["status"])
    if status not in RETRIABLE:
        raise RetryNotAllowed(tool_call_id, status.value, why_not_retriable(status))
    if run_stopped:
        raise RunStopped(run_id)
    fields, payload = retry_of(call, request, actor, registry)
    moved = await move(
        session,
        tool_call_id,
        tenant=tenant,
        expected=status,
        target=S.AUTHORIZED,
        event_type=EventType.TOOL_CALL_RETRIED,
        producer=Producer.OPERATOR,
        causation_id=causation_id,
        topics=topics,
        fields=fields,
        payload=payload,
    )
    command = DispatchCommand.build(
        moved.row._mapping, producer=Producer.OPERATOR, causation_id=moved.event_id
    )
    await enqueue(session, [command.to_outbox_row(topics)])
    return ToolCallView.of(moved.row._mapping, await approval_ref(session, tenant, tool_call_id))
