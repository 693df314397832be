"""Read models: what the API and the library return, derived from recorded rows."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


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

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> ToolCallView:
        return cls.model_validate({name: row[name] for name in cls.model_fields})


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
