"""Wire models: the request bodies the API parses and what the API, the library and
the HTTP client return (read models derived from recorded rows).

Nothing here touches the database: :mod:`dispatcher.client` imports this module, and
an agent runtime that only submits calls must not load SQLAlchemy or psycopg.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from dispatcher.states import ApprovalStatus, EscalationStatus


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


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


class RetryRequest(BaseModel):
    """The body of ``POST /v1/tool-calls/{toolCallId}/retry``."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    reason: str = Field(min_length=1, max_length=2000)
    # A new key makes the provider treat the retry as a new request: only for a call
    # whose first request certainly had no effect, the operator's judgement.
    new_idempotency_key: bool = False


class StopRequest(BaseModel):
    """The body of ``POST /v1/runs/{runId}/stop``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str = Field(default="", max_length=2000)


class DecisionRequest(BaseModel):
    """The body of ``POST /v1/approvals/{approvalId}/decision``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision: Literal["approve", "reject"]
    reason: str = Field(default="", max_length=2000)


class ApprovalRef(_View):
    """A call's approval as its view shows it (the approvals row; the whole approval
    is ``GET /v1/approvals/{approvalId}``)."""

    approval_id: str
    status: ApprovalStatus
    expires_at: datetime

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> ApprovalRef:
        return cls.model_validate({name: row[name] for name in cls.model_fields})


class ToolCallView(_View):
    tool_call_id: str
    run_id: str
    turn_id: str | None
    capability_id: str
    input: dict[str, Any]
    idempotency_key: str
    status: str
    verification_status: str
    reconciliation_status: str
    external_request_id: str | None
    correlation_id: str | None
    causation_id: str | None
    reasoning_object_id: str | None
    dispatched_at: datetime | None
    accepted_at: datetime | None
    completed_at: datetime | None
    result: Any
    result_ref: str | None
    last_error: str | None
    version: int
    created_at: datetime
    updated_at: datetime
    # The call's approval, if its capability required one when it was submitted
    # (from the approvals table; not a column of the call's row).
    approval: ApprovalRef | None = None

    @classmethod
    def row_fields(cls) -> tuple[str, ...]:
        """The fields read from the call's own row."""
        return tuple(name for name in cls.model_fields if name != "approval")

    @classmethod
    def of(cls, row: Mapping[Any, Any], approval: ApprovalRef | None = None) -> ToolCallView:
        return cls.model_validate(
            {**{name: row[name] for name in cls.row_fields()}, "approval": approval}
        )


class EventView(_View):
    event_id: str
    event_type: str
    run_id: str
    turn_id: str | None
    producer: str
    reasoning_object_id: str | None
    capability_id: str | None
    correlation_id: str | None
    causation_id: str | None
    tool_call_id: str | None
    schema_version: int
    occurred_at: datetime
    payload: dict[str, Any]

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> EventView:
        return cls.model_validate({name: row[name] for name in cls.model_fields})


@dataclass(frozen=True, slots=True)
class Submission:
    """The recorded call; ``created`` is False when an earlier submission was replayed."""

    view: ToolCallView
    created: bool


class StopResult(_View):
    """What a stop did (the answer of ``POST /v1/runs/{runId}/stop``);
    ``already_stopped`` means an earlier stop did it all."""

    run_id: str
    stopped_at: datetime | None
    stopped_by: str | None
    reason: str | None
    already_stopped: bool
    cancelled: list[str] = Field(default_factory=list)
    compensation_requested: list[str] = Field(default_factory=list)
    in_flight: list[str] = Field(default_factory=list)


class ApprovalView(_View):
    """An approval as the API shows it."""

    approval_id: str
    tool_call_id: str
    run_id: str
    capability_id: str
    risk: str
    status: ApprovalStatus
    policy_version: int
    input_hash: str
    requested_by: str | None
    expires_at: datetime
    created_at: datetime
    closed_at: datetime | None
    decision: str | None
    decided_by: str | None
    decision_reason: str | None

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> ApprovalView:
        return cls.model_validate({name: row[name] for name in cls.model_fields})


class Finding(StrEnum):
    """What an operator established about an escalated call's effect."""

    CONFIRMED_SUCCESS = "confirmed_success"
    """The effect happened: the call is ``confirmed`` (verification confirmed_success)."""
    CONFIRMED_FAILURE = "confirmed_failure"
    """The effect did not happen: ``confirmed`` (verification confirmed_failure)."""
    COMPENSATED = "compensated"
    """The effect happened and has been undone: ``compensated``."""


class ResolveRequest(BaseModel):
    """The body of ``POST /v1/escalations/{id}/resolve``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    finding: Finding
    reason: str = Field(min_length=1, max_length=2000)


class EscalationView(_View):
    """An escalation as the API, the CLI and the escalations topic show it."""

    escalation_id: str
    tool_call_id: str
    tenant: str
    episode: int
    status: EscalationStatus
    reason: str
    evidence: dict[str, Any]
    created_at: datetime
    acknowledged_at: datetime | None
    acknowledged_by: str | None
    resolved_at: datetime | None
    resolved_by: str | None
    finding: Finding | None
    resolution_reason: str | None

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> EscalationView:
        return cls.model_validate({name: row[name] for name in cls.model_fields})
