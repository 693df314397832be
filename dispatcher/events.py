"""Typed execution events: the facts the runtime records, append-only.

Rows are built here and inserted in the same transaction as the state change they
describe (see :mod:`dispatcher.intake` and :mod:`dispatcher.transitions`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

SCHEMA_VERSION = 1


class EventType(StrEnum):
    TOOL_CALL_REQUESTED = "tool.call.requested"
    TOOL_CALL_AUTHORIZED = "tool.call.authorized"
    TOOL_CALL_DISPATCHING = "tool.call.dispatching"
    TOOL_CALL_ACCEPTED = "tool.call.accepted"
    TOOL_CALL_COMPLETED = "tool.call.completed"
    TOOL_CALL_FAILED = "tool.call.failed"
    TOOL_CALL_RESULT_UNKNOWN = "tool.call.result_unknown"
    TOOL_CALL_CONFIRMED = "tool.call.confirmed"
    TOOL_CALL_COMPENSATED = "tool.call.compensated"
    TOOL_CALL_ESCALATED = "tool.call.escalated"
    TOOL_CALL_REJECTED = "tool.call.rejected"
    TOOL_CALL_CANCELLED = "tool.call.cancelled"
    TOOL_CALL_REDISPATCHED = "tool.call.redispatched"


@dataclass(frozen=True, slots=True)
class CallContext:
    """The stable ids that tie an event to its run, turn, capability and call."""

    tenant: str
    run_id: str
    tool_call_id: str
    capability_id: str
    turn_id: str | None = None
    correlation_id: str | None = None
    reasoning_object_id: str | None = None

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> CallContext:
        """Context of a ``tool_calls`` row."""
        return cls(
            tenant=row["tenant"],
            run_id=row["run_id"],
            tool_call_id=row["tool_call_id"],
            capability_id=row["capability_id"],
            turn_id=row["turn_id"],
            correlation_id=row["correlation_id"],
            reasoning_object_id=row["reasoning_object_id"],
        )


def new_event_id() -> str:
    return f"evt_{uuid.uuid4().hex}"


def event_row(
    event_type: EventType,
    ctx: CallContext,
    *,
    producer: str,
    causation_id: str | None = None,
    payload: Mapping[str, Any] | None = None,
    event_id: str | None = None,
) -> dict[str, Any]:
    """Column values of one ``execution_events`` row."""
    return {
        "event_id": event_id or new_event_id(),
        "event_type": event_type.value,
        "tenant": ctx.tenant,
        "run_id": ctx.run_id,
        "turn_id": ctx.turn_id,
        "producer": producer,
        "reasoning_object_id": ctx.reasoning_object_id,
        "capability_id": ctx.capability_id,
        "correlation_id": ctx.correlation_id,
        "causation_id": causation_id,
        "tool_call_id": ctx.tool_call_id,
        "schema_version": SCHEMA_VERSION,
        "occurred_at": datetime.now(UTC),
        "payload": dict(payload or {}),
    }
