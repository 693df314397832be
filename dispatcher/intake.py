"""Intake: record a tool call, its first events and its dispatch command in the
caller's transaction. The same idempotency key replays the stored call; the same key
with a different request is refused."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from sqlalchemy import insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.capabilities import CapabilityRegistry, render_key_template
from dispatcher.errors import IdempotencyKeyReused, ToolCallIdConflict, ValidationFailed
from dispatcher.events import CallContext, EventType, event_row
from dispatcher.states import ExecutionStatus
from dispatcher.tables import execution_events, outbox, tool_calls
from dispatcher.views import ToolCallView
from outbox_relay import OutboxMessage

PRODUCER = "tool-dispatcher.intake"
DISPATCH_COMMAND = "tool.call.dispatch"
DEFAULT_DISPATCH_TOPIC = "tool-dispatcher.commands"

_Id = Field(default=None, min_length=1, max_length=200)


class SubmitRequest(BaseModel):
    """A producer's request to run a tool call (the body of ``POST /v1/tool-calls``)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    run_id: str = Field(min_length=1, max_length=200)
    capability_id: str = Field(min_length=1, max_length=200)
    input: dict[str, Any]
    tool_call_id: str | None = _Id
    turn_id: str | None = _Id
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=255)
    correlation_id: str | None = _Id
    causation_id: str | None = _Id
    reasoning_object_id: str | None = _Id


@dataclass(frozen=True, slots=True)
class Submission:
    """The recorded call; ``created`` is False when an earlier submission was replayed."""

    view: ToolCallView
    created: bool


def fingerprint(capability_id: str, call_input: dict[str, Any]) -> str:
    """Hash of the canonical JSON of what the call would do."""
    canonical = json.dumps(
        {"capabilityId": capability_id, "input": call_input},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


async def submit(
    session: AsyncSession,
    request: SubmitRequest,
    *,
    tenant: str,
    registry: CapabilityRegistry,
    dispatch_topic: str = DEFAULT_DISPATCH_TOPIC,
) -> Submission:
    """Record ``request`` inside the caller's open transaction; the caller commits.

    Nothing is committed here, so a producer's own domain write, the tool call and
    its outbox row commit or roll back together.
    """
    capability = registry.get(request.capability_id)
    if not capability.enabled:
        raise ValidationFailed(
            f"capability {capability.id!r} is disabled", capabilityId=capability.id
        )
    tool_call_id = request.tool_call_id or str(uuid.uuid4())
    key = request.idempotency_key or _default_key(
        request, tool_call_id, capability.idempotency_key_template
    )
    if len(key) > 255:
        raise ValidationFailed("the derived idempotency key is longer than 255 characters")
    fp = fingerprint(request.capability_id, request.input)
    status = (
        ExecutionStatus.PROPOSED if capability.requires_approval else ExecutionStatus.AUTHORIZED
    )

    inserted = (
        await session.execute(
            pg_insert(tool_calls)
            .values(
                tool_call_id=tool_call_id,
                tenant=tenant,
                run_id=request.run_id,
                turn_id=request.turn_id,
                capability_id=request.capability_id,
                input=request.input,
                idempotency_key=key,
                request_fingerprint=fp,
                status=status.value,
                correlation_id=request.correlation_id,
                causation_id=request.causation_id,
                reasoning_object_id=request.reasoning_object_id,
            )
            # No conflict target: a clash on the key or on the toolCallId both land here.
            # A concurrent uncommitted insert of the same key makes PostgreSQL wait for
            # it, so the SELECT below sees the winner.
            .on_conflict_do_nothing()
            .returning(*tool_calls.c)
        )
    ).first()
    if inserted is None:
        return await _replay(session, request, tenant=tenant, key=key, fingerprint_=fp)

    row = inserted._mapping
    ctx = CallContext.of(row)
    requested = event_row(
        EventType.TOOL_CALL_REQUESTED,
        ctx,
        producer=PRODUCER,
        causation_id=request.causation_id,
        payload={"idempotencyKey": key, "requiresApproval": capability.requires_approval},
    )
    events = [requested]
    if status is ExecutionStatus.AUTHORIZED:
        events.append(
            event_row(
                EventType.TOOL_CALL_AUTHORIZED,
                ctx,
                producer=PRODUCER,
                causation_id=requested["event_id"],
                payload={"reason": "no approval required"},
            )
        )
    await session.execute(insert(execution_events).values(events))
    if status is ExecutionStatus.AUTHORIZED:
        await session.execute(
            insert(outbox).values(
                dispatch_command(
                    ctx, key, topic=dispatch_topic, causation_id=events[-1]["event_id"]
                )
            )
        )
    return Submission(ToolCallView.of(row), created=True)


def dispatch_command(
    ctx: CallContext, idempotency_key: str, *, topic: str, causation_id: str
) -> dict[str, Any]:
    """Outbox row values of the command that asks a worker to run a call."""
    return OutboxMessage(
        topic=topic,
        key=ctx.tool_call_id,
        type=DISPATCH_COMMAND,
        source="/tool-dispatcher/intake",
        payload={
            "toolCallId": ctx.tool_call_id,
            "tenant": ctx.tenant,
            "runId": ctx.run_id,
            "capabilityId": ctx.capability_id,
            "idempotencyKey": idempotency_key,
            "causationId": causation_id,
        },
    ).row()


def _default_key(request: SubmitRequest, tool_call_id: str, template: str | None) -> str:
    if template is None:
        return tool_call_id
    return render_key_template(
        template,
        {
            "input": request.input,
            "runId": request.run_id,
            "turnId": request.turn_id,
            "capabilityId": request.capability_id,
            "correlationId": request.correlation_id,
            "toolCallId": tool_call_id,
        },
    )


async def _replay(
    session: AsyncSession, request: SubmitRequest, *, tenant: str, key: str, fingerprint_: str
) -> Submission:
    existing = (
        await session.execute(
            select(tool_calls).where(
                tool_calls.c.tenant == tenant, tool_calls.c.idempotency_key == key
            )
        )
    ).first()
    if existing is None:
        # The key is free, so the clash was on the primary key: another call owns the id.
        raise ToolCallIdConflict(request.tool_call_id or "")
    row = existing._mapping
    same_id = request.tool_call_id in (None, row["tool_call_id"])
    if row["request_fingerprint"] != fingerprint_ or not same_id:
        raise IdempotencyKeyReused(key, row["tool_call_id"])
    return Submission(ToolCallView.of(row), created=False)
