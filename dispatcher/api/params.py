"""Path and query parameters that carry identifiers: the identifier contract of
:mod:`dispatcher.schemas`, so a path id is checked exactly like the same id in a body.
A malformed id is a 400 ``validation_failed`` naming the parameter; a well-formed id
that names nothing stays a 404."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query
from pydantic import AfterValidator

from dispatcher.schemas import ID_MAX_LENGTH, check_identifier, id_schema
from dispatcher.views.cursors import CURSOR_MAX_LENGTH, CURSOR_PATTERN

_DOC = id_schema(ID_MAX_LENGTH)


def _check_cursor(value: str | None) -> str | None:
    return None if value is None else check_identifier(value)


ToolCallIdPath = Annotated[str, AfterValidator(check_identifier), Path(json_schema_extra=_DOC)]
RunIdPath = Annotated[str, AfterValidator(check_identifier), Path(json_schema_extra=_DOC)]
ApprovalIdPath = Annotated[str, AfterValidator(check_identifier), Path(json_schema_extra=_DOC)]
EscalationIdPath = Annotated[str, AfterValidator(check_identifier), Path(json_schema_extra=_DOC)]
CapabilityIdPath = Annotated[str, AfterValidator(check_identifier), Path(json_schema_extra=_DOC)]
AfterCursor = Annotated[
    str | None,
    Query(
        description="the `next` of the page before (an opaque cursor); none: the first page",
        max_length=CURSOR_MAX_LENGTH,
        pattern=CURSOR_PATTERN,
    ),
]
"""The ``after`` of a keyset list (approvals, escalations): checked for its form here,
read by :class:`dispatcher.views.cursors.Position` (a 400 when it names no position)."""
EventCursor = Annotated[
    str | None,
    AfterValidator(_check_cursor),
    Query(description="return events after this eventId", json_schema_extra=_DOC),
]
