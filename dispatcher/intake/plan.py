"""What a created call writes besides its row: its first events, its dispatch command
or its approval (:func:`plan_created`), planned before the one intake statement
(:mod:`dispatcher.intake.statement`) writes them all, with the events' outbox rows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from dispatcher.capabilities import Capability
from dispatcher.ids import random_hex
from dispatcher.ledger.events import CallContext, EventType, envelope, event_row
from dispatcher.ledger.messages import DispatchCommand, Producer
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import Topics
from dispatcher.tracing import Trace, trace_headers

VIA_HTTP: dict[str, Any] = {"http": {}}
VIA_LIBRARY: dict[str, Any] = {"library": {}}


@dataclass(frozen=True, slots=True)
class Prepared:
    request: SubmitRequest
    tenant: str
    capability: Capability
    submitted_by: str | None
    values: dict[str, Any]
    # The request's fingerprint (dispatcher.intake.keys.fingerprint), as hex digits.
    fingerprint: str
    trace: Trace = None
    # Where the request came from, kept in the call's first event as ``via``: the API
    # (:data:`VIA_HTTP`), the library (:data:`VIA_LIBRARY`) or the bus record
    # (``{"bus": {"topic", "partition", "offset"}}``).
    origin: dict[str, Any] | None = None

    @property
    def requires_approval(self) -> bool:
        return self.capability.requires_approval

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant, self.values["idempotency_key"])


def plan_created(
    prep: Prepared,
    events: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    approvals: list[dict[str, Any]],
    topics: Topics,
) -> None:
    """Append the event, outbox and approval rows that record ``prep`` if it is created."""
    ctx = CallContext.of(prep.values)
    call = prep.values["tool_call_id"]
    new = [
        event_row(
            EventType.TOOL_CALL_REQUESTED,
            ctx,
            producer=Producer.INTAKE,
            causation_id=prep.request.causation_id,
            # The key is the call's (GET /v1/tool-calls/{id}) and its dispatch command's:
            # kept once per call, not again in every call's first event (bench.growth).
            payload=(
                {"requiresApproval": prep.requires_approval, "via": prep.origin}
                if prep.origin
                else {"requiresApproval": prep.requires_approval}
            ),
        )
    ]
    if prep.requires_approval:
        approval = _approval(prep)
        approvals.append(approval)
        new.append(
            event_row(
                EventType.APPROVAL_REQUIRED,
                ctx,
                producer=Producer.INTAKE,
                causation_id=new[0]["event_id"],
                payload={
                    "approvalId": approval["approval_id"],
                    "risk": approval["risk"],
                    "expiresAt": approval["expires_at"],
                },
            )
        )
    else:
        new.append(
            event_row(
                EventType.TOOL_CALL_AUTHORIZED,
                ctx,
                producer=Producer.INTAKE,
                causation_id=new[0]["event_id"],
                payload={"reason": "no approval required"},
            )
        )
    # The events' messages are built by the intake statement from the rows it inserts
    # (dispatcher.intake.statement); the dispatch command is the one message planned here.
    context = trace_headers(prep.trace) if prep.trace is not None else {}
    if not prep.requires_approval:
        command = DispatchCommand.build(
            prep.values, producer=Producer.INTAKE, causation_id=new[-1]["event_id"]
        ).to_outbox_row(topics)
        # Every message of the submission carries its context (the relay copies row
        # headers to the Kafka message), the dispatch command's consumer continues it.
        command["headers"].update(context)
        messages.append({**command, "call_tenant": prep.tenant, "call": call})
    # Each event as its message's payload, which the statement takes as it is.
    events.extend(
        {"message": envelope(e), "call_tenant": prep.tenant, "call": call, **context} for e in new
    )


def _approval(prep: Prepared) -> dict[str, Any]:
    """The approval row of a call that needs one (JSON parameter values)."""
    capability = prep.capability
    # The application's clock: the same instant goes into the row and the event.
    expires_at = datetime.now(UTC) + timedelta(seconds=capability.approval_ttl_seconds)
    return {
        "approval_id": f"apr_{random_hex()}",
        "tool_call_id": prep.values["tool_call_id"],
        "tenant": prep.tenant,
        "run_id": prep.values["run_id"],
        "capability_id": capability.id,
        "risk": capability.risk,
        "input_hash": prep.fingerprint,
        "policy_version": capability.policy_version,
        "requested_by": prep.submitted_by,
        "expires_at": expires_at.isoformat(),
    }
