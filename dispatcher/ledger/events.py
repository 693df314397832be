"""Typed execution events: the facts the runtime records, append-only.

Rows are built here and inserted in the same transaction as the state change they
describe (see :mod:`dispatcher.intake.service` and :mod:`dispatcher.ledger.transitions`);
each but those of :data:`LOG_ONLY` is published on the events topic through the outbox
(:mod:`dispatcher.ledger.messages`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import execution_events
from dispatcher.ids import random_hex
from dispatcher.ledger.messages import Producer, ce_source, enqueue, outbox_row
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.tenancy import ordering_key
from outbox_relay.table import CLOUDEVENTS_SPEC_VERSION

SCHEMA_VERSION = 1


class EventType(StrEnum):
    """Every kind of execution fact; each has a JSON Schema in ``docs/events``."""

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
    # Facts that do not change the execution status.
    TOOL_CALL_RECONCILE_ATTEMPTED = "tool.call.reconcile_attempted"
    TOOL_CALL_COMPENSATION_REQUESTED = "tool.call.compensation_requested"
    TOOL_CALL_ESCALATION_ACKNOWLEDGED = "tool.call.escalation_acknowledged"
    # The call's dispatch command was written again: the broker lost the first one.
    TOOL_CALL_REDRIVEN = "tool.call.redriven"
    # An operator's retry command: failed / escalated -> authorized.
    TOOL_CALL_RETRIED = "tool.call.retried"
    # Approvals: required at intake (the call stays proposed); granted (-> authorized),
    # rejected (-> rejected) or expired (-> cancelled) exactly once.
    APPROVAL_REQUIRED = "approval.required"
    APPROVAL_GRANTED = "approval.granted"
    APPROVAL_REJECTED = "approval.rejected"
    APPROVAL_EXPIRED = "approval.expired"
    # A run-level fact: no tool call of its own.
    RUN_STOPPED = "run.stopped"


LOG_ONLY: frozenset[EventType] = frozenset({EventType.TOOL_CALL_DISPATCHING})
"""The event types recorded in the log (``execution_events``: the API's events, the
console, the run view's fold, the chaos checker) but never published on the events
topic; every writer of events and their messages leaves these out of the outbox
(:func:`record_events`, :func:`published_sql`).

A claim (``authorized -> dispatching``) is the worker's bookkeeping: its message would
be one more outbox row for every call dispatched, for the relay and the broker to
carry, and what a consumer acts on is what follows it, each of which is published
(``completed``, ``accepted``, ``failed``, ``result_unknown``, or a takeover by the
recovery sweep). ``tool.call.redispatched`` stays published: a reconciler's re-send of
a call in doubt, or the recovery sweep running a read-only call again, is news to a
consumer, not routine."""


def is_published(event_type: str) -> bool:
    """Whether an event of ``event_type`` also goes on the events topic."""
    return event_type not in LOG_ONLY


def published_sql(row: str) -> str:
    """:func:`is_published` as a SQL condition on ``row``, an alias with an ``event_type``
    column: the types are constants in the text, so a statement's text stays the same
    (compiled and prepared once) and no parameter carries them."""
    if not LOG_ONLY:
        return "true"
    # Event types are this module's constants (dotted lowercase words): nothing to quote.
    kept_out = ", ".join(f"'{t.value}'" for t in sorted(LOG_ONLY))
    return f"{row}.event_type NOT IN ({kept_out})"


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


_INSERT_EVENTS = insert(execution_events)


def new_event_id() -> str:
    return f"evt_{random_hex()}"


def event_row(
    event_type: EventType,
    ctx: CallContext,
    *,
    producer: Producer,
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


def run_event_row(
    event_type: EventType,
    *,
    tenant: str,
    run_id: str,
    producer: Producer,
    payload: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Column values of an ``execution_events`` row about a whole run (no call)."""
    ctx = CallContext(tenant=tenant, run_id=run_id, tool_call_id="", capability_id="")
    return {
        **event_row(event_type, ctx, producer=producer, payload=payload),
        "tool_call_id": None,
        "capability_id": None,
    }


ENVELOPE = {
    "eventId": "event_id",
    "eventType": "event_type",
    "tenant": "tenant",
    "runId": "run_id",
    "turnId": "turn_id",
    "producer": "producer",
    "reasoningObjectId": "reasoning_object_id",
    "capabilityId": "capability_id",
    "correlationId": "correlation_id",
    "causationId": "causation_id",
    "toolCallId": "tool_call_id",
    "schemaVersion": "schema_version",
    "payload": "payload",
}
"""The published name of each column of an event row (and ``occurredAt``, its time as
ISO 8601 text), for :func:`envelope` and its SQL twin :func:`envelope_sql`."""


PUBLISHED_AS = {**ENVELOPE, "occurredAt": "occurred_at"}
"""Every name of an event's published form (:func:`envelope`) and its column: a batch
statement takes each event as that form and reads the row's columns from it."""


def envelope(event: Mapping[str, Any]) -> dict[str, Any]:
    """The published (camelCase) form of an event row: what the events topic carries
    and what ``docs/events/<eventType>.json`` describes."""
    occurred_at: datetime = event["occurred_at"]
    return {
        **{name: event[column] for name, column in ENVELOPE.items()},
        "occurredAt": occurred_at.isoformat(),
    }


def envelope_sql(row: str, occurred: str) -> tuple[str, str]:
    """:func:`event_message`'s payload and headers as SQL over ``row``, an alias whose
    columns are an event row's, and ``occurred``, its time as ISO 8601 text: the
    routed moves (:mod:`dispatcher.ledger.routed`) build their events' messages from
    the events they insert, and rows made in SQL (``bench.growth_rows``) theirs. The
    other statements take each event as its payload (:func:`envelope`) and keep it."""
    pairs = [f"'{name}', {row}.{column}" for name, column in ENVELOPE.items()]
    payload = f"jsonb_build_object({', '.join(pairs)}, 'occurredAt', {occurred})"
    return payload, headers_sql(f"{row}.event_id", f"{row}.event_type", f"{row}.producer", occurred)


def headers_sql(event_id: str, event_type: str, producer: str, occurred: str) -> str:
    """:func:`event_message`'s headers as SQL over an event's id, type, producer and
    time (ISO 8601 text), each an SQL expression."""
    return (
        f"jsonb_build_object('ce_id', {event_id}, 'ce_type', {event_type},"
        f" 'ce_source', '{ce_source('')}' || {producer},"
        f" 'ce_specversion', '{CLOUDEVENTS_SPEC_VERSION}', 'ce_time', {occurred})"
    )


def event_message(event: Mapping[str, Any], topics: Topics) -> dict[str, Any]:
    """Outbox row values publishing ``event`` (an :func:`event_row`) on the events topic.

    Keyed by the tenant's run (:func:`dispatcher.tenancy.ordering_key`), so a consumer
    sees each run's facts in order; the message id is the event id, so consumers drop
    duplicates by it.
    """
    return outbox_row(
        topic=topics.events,
        key=ordering_key(event["tenant"], event["run_id"]),
        type=event["event_type"],
        source=ce_source(event["producer"]),
        payload=envelope(event),
        message_id=event["event_id"],
        time=event["occurred_at"],
    )


async def record_events(
    session: AsyncSession,
    events: Sequence[Mapping[str, Any]],
    *,
    topics: Topics = DEFAULT_TOPICS,
) -> None:
    """Append ``events`` to the log and the messages of those published (all but
    :data:`LOG_ONLY`'s) to the outbox, in the caller's transaction."""
    if not events:
        return
    # A list of parameter sets, not .values(list): the compiled statement is cached.
    await session.execute(_INSERT_EVENTS, list(events))
    await enqueue(
        session, [event_message(e, topics) for e in events if is_published(e["event_type"])]
    )
