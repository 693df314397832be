"""What an operation does to each call of a batch: the single-call command of its kind,
with the operation as the cause of the call's event, so a call moved by an operation
has the same event, payload and dispatch command as one moved by hand. A batch of
retries goes through :func:`dispatcher.control.operations.retry_many`, the single
retry's checks and writes for the whole batch in a few statements.

A refusal of the command (the call moved since it was selected, its run was stopped)
is the call's outcome, not the batch's failure: every such refusal is raised before
the command writes anything, so the batch's transaction carries on without it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.actor import Actor
from dispatcher.control.escalations import resolve
from dispatcher.control.operations import cancel_call, retry_many
from dispatcher.control.outbox import discard_dead_letter, retry_dead_letter
from dispatcher.control.retry import retry_call
from dispatcher.db.tables import escalations
from dispatcher.errors import Conflict, DispatcherError, EscalationNotFound, NotFound
from dispatcher.operations.models import OperationKind
from dispatcher.schemas import Finding, RetryRequest
from dispatcher.settings import Topics
from dispatcher.states import EscalationStatus


@dataclass(frozen=True, slots=True)
class Touch:
    """One call of a batch, and what its command needs."""

    tenant: str
    tool_call_id: str
    operation_id: str
    params: dict[str, Any]
    actor: Actor
    registry: CapabilityRegistry
    topics: Topics


Action = Callable[[AsyncSession, Touch], Awaitable[str | None]]
"""A command on one call; returns the event it recorded, when it knows it."""


def _retry_request(params: dict[str, Any]) -> RetryRequest:
    return RetryRequest(
        reason=params["reason"],
        new_idempotency_key=bool(params.get("newIdempotencyKey", False)),
    )


async def _retry(session: AsyncSession, touch: Touch) -> str | None:
    request = _retry_request(touch.params)
    await retry_call(
        session,
        touch.tool_call_id,
        request,
        tenant=touch.tenant,
        actor=touch.actor,
        registry=touch.registry,
        topics=touch.topics,
        causation_id=touch.operation_id,
    )
    return None


async def _resolve(session: AsyncSession, touch: Touch) -> str | None:
    # The call's escalation still unresolved (its latest episode): the one to settle.
    e = escalations.c
    found = await session.execute(
        select(e.escalation_id)
        .where(
            e.tenant == touch.tenant,
            e.tool_call_id == touch.tool_call_id,
            e.status != EscalationStatus.RESOLVED.value,
        )
        .order_by(e.episode.desc())
        .limit(1)
    )
    escalation_id = found.scalar_one_or_none()
    if escalation_id is None:
        raise EscalationNotFound(f"call {touch.tool_call_id}'s escalation")
    await resolve(
        session,
        escalation_id,
        finding=Finding(touch.params["finding"]),
        reason=touch.params["reason"],
        actor=touch.actor,
        tenant=touch.tenant,
        topics=touch.topics,
        causation_id=touch.operation_id,
    )
    return None


async def _cancel(session: AsyncSession, touch: Touch) -> str | None:
    moved = await cancel_call(
        session,
        touch.tool_call_id,
        tenant=touch.tenant,
        actor=touch.actor,
        reason=touch.params["reason"],
        causation_id=touch.operation_id,
        topics=touch.topics,
    )
    return moved.event_id


async def _retry_dead_letter(session: AsyncSession, touch: Touch) -> str | None:
    row_id = int(touch.tool_call_id)
    await retry_dead_letter(session, row_id, tenant=touch.tenant, actor=touch.actor)
    return None


async def _discard_dead_letter(session: AsyncSession, touch: Touch) -> str | None:
    row_id = int(touch.tool_call_id)
    await discard_dead_letter(session, row_id, tenant=touch.tenant, actor=touch.actor)
    return None


ACTIONS: dict[OperationKind, Action] = {
    OperationKind.RETRY: _retry,
    OperationKind.RESOLVE: _resolve,
    OperationKind.CANCEL: _cancel,
    OperationKind.RETRY_DEAD_LETTERS: _retry_dead_letter,
    OperationKind.DISCARD_DEAD_LETTERS: _discard_dead_letter,
}
"""The kinds a processor can carry out (a kind not listed is refused at submission)."""


async def touch_batch(
    session: AsyncSession, kind: OperationKind, touches: Sequence[Touch]
) -> list[dict[str, Any]]:
    """Apply ``kind`` to each call of a batch; their ``bulk_operation_calls`` rows. A
    retry takes the whole batch at once (:func:`retry_many`, the single retry's effects
    in a few statements); the other kinds go a call at a time."""
    if kind is not OperationKind.RETRY or not touches:
        return [await touch_call(session, kind, t) for t in touches]
    first = touches[0]
    outcome = await retry_many(
        session,
        [(t.tenant, t.tool_call_id) for t in touches],
        _retry_request(first.params),
        actor=first.actor,
        registry=first.registry,
        causation_id=first.operation_id,
        topics=first.topics,
    )
    return [_touched(t, outcome[(t.tenant, t.tool_call_id)]) for t in touches]


def _touched(touch: Touch, outcome: str | DispatcherError | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "operation_id": touch.operation_id,
        "tenant": touch.tenant,
        "tool_call_id": touch.tool_call_id,
    }
    if isinstance(outcome, DispatcherError):
        return row | {
            "outcome": "refused",
            "code": outcome.code,
            "detail": outcome.detail,
            "event_id": None,
        }
    return row | {"outcome": "done", "code": None, "detail": None, "event_id": outcome}


async def touch_call(session: AsyncSession, kind: OperationKind, touch: Touch) -> dict[str, Any]:
    """Apply ``kind`` to the call; its ``bulk_operation_calls`` row's values."""
    try:
        event_id = await ACTIONS[kind](session, touch)
    except (Conflict, NotFound) as exc:
        return _touched(touch, exc)
    return _touched(touch, event_id)
