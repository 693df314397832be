"""What tool-dispatcher publishes, and the one way (besides the batch intake statement)
it goes into the outbox: :func:`enqueue`, in the writer's transaction.

Every message's CloudEvents ``ce_source`` names the :class:`Producer` that wrote it
(:func:`ce_source`); the relay turns the outbox row into headers and publishes it
unchanged. A dispatch command (:class:`DispatchCommand`) also names its cause: the id
of the event its writer recorded in the same transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import orjson
from sqlalchemy import ColumnElement, insert
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import DISPATCH_TYPE, outbox
from dispatcher.ids import random_uuid
from dispatcher.settings import Topics
from dispatcher.tenancy import ordering_key
from outbox_relay import OutboxMessage

DISPATCH = DISPATCH_TYPE


class Producer(StrEnum):
    """Who wrote an event or a message: the event envelope's ``producer``, and the
    message's ``ce_source`` (:func:`ce_source`)."""

    INTAKE = "tool-dispatcher.intake"
    """Submissions: a call's first events and its first dispatch command."""
    APPROVALS = "tool-dispatcher.approvals"
    """A human's decision on an approval, and its expiry."""
    WORKER = "tool-dispatcher.worker"
    """Claims and outcomes of dispatch commands."""
    RECOVERY = "tool-dispatcher.recovery"
    """The sweep of calls whose worker died between claim and outcome."""
    REDRIVE = "tool-dispatcher.redrive"
    """Dispatch commands written again after the broker lost them."""
    RECONCILER = "tool-dispatcher.reconciler"
    """Settling calls in doubt; opening escalations."""
    OPERATOR = "tool-dispatcher.operator"
    """Operator commands: retry, stop a run, acknowledge and resolve escalations."""


def ce_source(producer: str) -> str:
    """The CloudEvents source of everything ``producer`` writes."""
    return f"/tool-dispatcher/{producer}"


def outbox_row(
    *,
    topic: str,
    key: str,
    type: str,
    source: str,
    payload: dict[str, Any],
    message_id: str | None = None,
    time: datetime | None = None,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Outbox row values of one message; ``source`` is its writer's :func:`ce_source`.
    The id (fresh unless given) and time are fixed here, so every re-publish carries
    the same. ``headers`` are further message headers (a ``traceparent``)."""
    fixed: dict[str, Any] = {"headers": dict(headers)} if headers else {}
    fixed["message_id"] = message_id if message_id is not None else random_uuid()
    if time is not None:
        fixed["time"] = time
    return OutboxMessage(
        topic=topic, key=key, type=type, source=source, payload=payload, **fixed
    ).row()


async def enqueue(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Add outbox rows (:func:`outbox_row`) in the caller's transaction."""
    if rows:
        # A list of parameter sets, not .values(list): the compiled statement is cached.
        await session.execute(insert(outbox), list(rows))


def tenant_rows(tenant: str) -> ColumnElement[bool]:
    """Outbox rows of ``tenant``: every message tool-dispatcher writes names its tenant
    in the payload (the outbox itself knows no tenants)."""
    mine: ColumnElement[bool] = outbox.c.payload["tenant"].astext == tenant
    return mine


_COMMAND_FIELDS = {
    "tool_call_id": "toolCallId",
    "tenant": "tenant",
    "run_id": "runId",
    "capability_id": "capabilityId",
    "idempotency_key": "idempotencyKey",
}


@dataclass(frozen=True, slots=True)
class DispatchCommand:
    """The message that asks a worker to run a call (``tool.call.dispatch``).

    A worker trusts only ``tenant`` and ``tool_call_id`` (the call's key): the call's
    row decides whether and what it runs, so a repeated or late command is dropped by
    the call's state.
    """

    tool_call_id: str
    tenant: str
    run_id: str
    capability_id: str
    idempotency_key: str
    causation_id: str | None
    """The event its writer recorded in the same transaction; None only in commands
    written before every writer named one."""
    source: str
    """Its ``ce_source``: :func:`ce_source` of its writer."""
    traceparent: str | None = None
    """The call's stored trace context (``tool_calls.traceparent``), sent as the
    message's ``traceparent`` header: the worker's span continues the call's trace."""

    @classmethod
    def build(
        cls, call: Mapping[Any, Any], *, producer: Producer, causation_id: str
    ) -> DispatchCommand:
        """The command for ``call`` (a ``tool_calls`` row, its idempotency key as it
        will be sent), written by ``producer`` because of its event ``causation_id``."""
        return cls(
            **{name: call[name] for name in _COMMAND_FIELDS},
            causation_id=causation_id,
            source=ce_source(producer),
            traceparent=call.get("traceparent"),
        )

    def to_outbox_row(self, topics: Topics) -> dict[str, Any]:
        """Outbox row values publishing the command, keyed by the tenant's call (one
        call's commands stay in order)."""
        payload: dict[str, Any] = {
            wire: getattr(self, name) for name, wire in _COMMAND_FIELDS.items()
        }
        payload["causationId"] = self.causation_id
        return outbox_row(
            topic=topics.dispatch,
            key=ordering_key(self.tenant, self.tool_call_id),
            type=DISPATCH,
            source=self.source,
            payload=payload,
            headers={"traceparent": self.traceparent} if self.traceparent else None,
        )

    @classmethod
    def parse(
        cls, value: bytes | None, headers: Sequence[tuple[str, bytes]] = ()
    ) -> DispatchCommand | None:
        """The command a consumed record carries (its value and Kafka headers), or
        None for a message that is not a whole dispatch command."""
        try:
            # orjson: a worker parses every command it consumes. Only strings are read.
            payload = orjson.loads(value) if value is not None else None
        except orjson.JSONDecodeError:
            return None
        if not isinstance(payload, dict):
            return None
        fields: dict[str, Any] = {name: payload.get(wire) for name, wire in _COMMAND_FIELDS.items()}
        if not all(isinstance(v, str) and v for v in fields.values()):
            return None
        causation = payload.get("causationId")
        source = dict(headers).get("ce_source") or b""
        return cls(
            **fields,
            causation_id=causation if isinstance(causation, str) else None,
            source=source.decode(errors="replace"),
        )


class EscalationMessage(StrEnum):
    """The messages of the escalations topic."""

    OPENED = "tool.call.escalation.opened"
    RESOLVED = "tool.call.escalation.resolved"


def escalation_message(
    kind: EscalationMessage, escalation: Mapping[str, Any], *, producer: str, topics: Topics
) -> dict[str, Any]:
    """Outbox row values announcing an escalation (its published, camelCase form).

    Keyed by the tenant's call. The message id is the escalation id for an opening and
    ``<escalationId>:resolved`` for its resolution: the escalation row exists once per
    episode, so each message does too, and consumers drop the relay's repeats by it.
    """
    escalation_id = escalation["escalationId"]
    return outbox_row(
        topic=topics.escalations,
        key=ordering_key(escalation["tenant"], escalation["toolCallId"]),
        type=kind.value,
        source=ce_source(producer),
        payload=dict(escalation),
        message_id=escalation_id
        if kind is EscalationMessage.OPENED
        else f"{escalation_id}:resolved",
    )
