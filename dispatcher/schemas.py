"""Wire models: the request bodies the API parses and what the API, the library and
the HTTP client return (read models derived from recorded rows).

Nothing here touches the database: :mod:`dispatcher.client` imports this module, and
an agent runtime that only submits calls must not load SQLAlchemy or psycopg.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from dispatcher.states import ApprovalStatus, EscalationStatus
from dispatcher.storable import MAX_INPUT_DEPTH as MAX_INPUT_DEPTH
from dispatcher.storable import unstorable


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


# The identifier contract: every id a client names, in a body, a path or a query.
# Printable ASCII without "/" (0x21-0x7E less 0x2F), because an id travels in URL paths
# (a "/" there, even as %2F, is decoded into a separator before routing, so the id
# could never be read again), in the provider's Idempotency-Key header (which carries
# ASCII only, and where CR/LF would split the header) and in the Location of a 201.
# No space: servers and proxies strip it at the edges of header values, so a key
# ending in a space would reach the provider as another key. "." and ".." are refused
# too: clients normalise them away as URL path segments.
ID_PATTERN = r"^[!-.0-~]+$"
ID_MAX_LENGTH = 200
KEY_MAX_LENGTH = 255
# fullmatch: Python's "$" also matches before a final newline.
_ID_CHARS = re.compile(r"[!-.0-~]+")


def check_identifier(value: str, max_length: int = ID_MAX_LENGTH) -> str:
    """``value`` if it keeps the identifier contract, else a pydantic error saying why."""
    if not 1 <= len(value) <= max_length:
        raise PydanticCustomError(
            "identifier_length",
            "must be 1 to {max_length} characters long",
            {"max_length": max_length},
        )
    if _ID_CHARS.fullmatch(value) is None or value in (".", ".."):
        raise PydanticCustomError(
            "identifier_chars",
            'must be printable ASCII (0x21-0x7E) without "/", and not "." or ".."',
        )
    return value


def id_schema(max_length: int) -> dict[str, Any]:
    """The contract as JSON Schema, for the OpenAPI document (check_identifier is what
    enforces it, with a message that says what an id may hold)."""
    return {
        "pattern": ID_PATTERN,
        "minLength": 1,
        "maxLength": max_length,
        "not": {"enum": [".", ".."]},
    }


def _check_key(value: str) -> str:
    return check_identifier(value, KEY_MAX_LENGTH)


Identifier = Annotated[
    str,
    AfterValidator(check_identifier),
    Field(json_schema_extra=id_schema(ID_MAX_LENGTH)),
]
"""A toolCallId, runId, turnId, correlationId, causationId, reasoningObjectId,
approvalId, escalationId or event id."""

IdempotencyKey = Annotated[
    str,
    AfterValidator(_check_key),
    Field(json_schema_extra=id_schema(KEY_MAX_LENGTH)),
]
"""An idempotency key: an identifier of up to 255 characters."""


def _check_text(value: str) -> str:
    if "\x00" in value:
        raise PydanticCustomError("nul_character", "must not contain a NUL character")
    return value


StorableText = Annotated[str, AfterValidator(_check_text)]
"""Free text (a reason): PostgreSQL text cannot hold a NUL character."""


class SubmitRequest(BaseModel):
    """A producer's request to run a tool call (the body of ``POST /v1/tool-calls``)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    run_id: Identifier
    capability_id: str = Field(min_length=1, max_length=200)
    input: dict[str, Any]
    tool_call_id: Identifier | None = None
    turn_id: Identifier | None = None
    idempotency_key: IdempotencyKey | None = None
    correlation_id: Identifier | None = None
    causation_id: Identifier | None = None
    reasoning_object_id: Identifier | None = None
    tool_name: Identifier | None = Field(
        default=None,
        description="the agent's tool this call executes (its tool call's id is the"
        " toolCallId): the call's spans then carry the GenAI tool-execution attributes",
    )

    @field_validator("input")
    @classmethod
    def _storable(cls, value: dict[str, Any]) -> dict[str, Any]:
        found = unstorable(value)
        if found is not None:
            # The JSON path goes into the context: the API names it as the field.
            raise PydanticCustomError(
                "unstorable_value", "{path}: {fault}", {"path": found[0], "fault": found[1]}
            )
        return value


class RetryRequest(BaseModel):
    """The body of ``POST /v1/tool-calls/{toolCallId}/retry``."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    reason: StorableText = Field(min_length=1, max_length=2000)
    # A new key makes the provider treat the retry as a new request: only for a call
    # whose first request certainly had no effect, the operator's judgement.
    new_idempotency_key: bool = False


class StopRequest(BaseModel):
    """The body of ``POST /v1/runs/{runId}/stop``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: StorableText = Field(default="", max_length=2000)


class DecisionRequest(BaseModel):
    """The body of ``POST /v1/approvals/{approvalId}/decision``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision: Literal["approve", "reject"]
    reason: StorableText = Field(default="", max_length=2000)


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
        return _TOOL_CALL_ROW_FIELDS

    @classmethod
    def of(cls, row: Mapping[Any, Any], approval: ApprovalRef | None = None) -> ToolCallView:
        return cls.model_validate(
            {**{name: row[name] for name in _TOOL_CALL_ROW_FIELDS}, "approval": approval}
        )


# Listed once: every view built on the intake and read paths reads them.
_TOOL_CALL_ROW_FIELDS = tuple(name for name in ToolCallView.model_fields if name != "approval")


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
    reason: StorableText = Field(min_length=1, max_length=2000)


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


class EventLog(_View):
    """The answer of ``GET /v1/runs/{runId}/events``."""

    run_id: str
    events: list[EventView]


class ApprovalList(_View):
    """The answer of ``GET /v1/approvals``, expiring soonest first: ``next`` is the
    ``after`` of the next page (an opaque cursor), null on the last one."""

    approvals: list[ApprovalView]
    next: str | None


class EscalationList(_View):
    """The answer of ``GET /v1/escalations``, open first, then acknowledged, then
    resolved, oldest first within each: ``next`` is the ``after`` of the next page (an
    opaque cursor), null on the last one."""

    escalations: list[EscalationView]
    next: str | None


class DeadLetterView(_View):
    """An outbox row the broker refused for good, of the caller's tenant, and how many
    of the tenant's later rows of its key wait behind it (``blockedRows``)."""

    id: int
    topic: str
    key: str
    message_id: str | None
    attempts: int
    last_error: str | None
    dead_lettered_at: datetime
    created_at: datetime
    blocked_rows: int


class DeadLetterList(_View):
    """The answer of ``GET /v1/outbox/dead-letters``, oldest first: ``next`` is the
    ``after`` of the next page, null on the last one."""

    dead_letters: list[DeadLetterView]
    next: int | None


class DeadLetterOutcome(_View):
    """The answer of a dead letter's retry (back in line) or discard (deleted)."""

    id: int
    action: Literal["retried", "discarded"]


class DiscardRequest(BaseModel):
    """The body of a dead letter's discard, which loses the message for good: the
    caller says so (``{"confirm": true}``); without it nothing changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    confirm: Literal[True]
