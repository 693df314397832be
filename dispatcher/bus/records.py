"""A request record of bus intake read as what it asks: a CloudEvent in Kafka's binary
binding (``ce_*`` headers, JSON data) carrying the same submission as
``POST /v1/tool-calls``, for the tenant its topic is bound to.

Reading decides everything that needs no database. A record is either a
:class:`Request` or a :class:`Refused` one: unreadable (no CloudEvent, no JSON object,
too large: copied to the dead-letter topic) or readable but refused (another tenant
named, a submission that fails validation). A refusal is answered when the record says
whom to answer (its ``ce_id`` and ``ce_source``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from cloudevents.core.bindings.kafka import KafkaMessage, from_binary
from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.formats.json import JSONFormat
from pydantic import ValidationError

from dispatcher.errors import (
    DispatcherError,
    PayloadTooLarge,
    TenantMismatch,
    UnreadableRecord,
    ValidationFailed,
)
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import BusRoute

SUBMIT = "tool.call.submit"
"""The CloudEvents type of a request record."""
ACCEPTED, REFUSED = "tool.call.submit.accepted", "tool.call.submit.refused"
"""The CloudEvents types of the two replies."""
JSON_TYPES = ("application/json", "application/cloudevents+json")
_FORMAT = JSONFormat()

Headers = Sequence[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class At:
    """Where a record was read: what a call from the bus names as its origin."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None = None
    fingerprint: bytes | None = None
    """The record's identity in its partition (:func:`dispatcher.bus.continuity.fingerprint`)."""

    def origin(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset}


@dataclass(frozen=True, slots=True)
class Request:
    at: At
    route: BusRoute
    event_id: str
    source: str
    submission: SubmitRequest
    traceparent: str | None
    tracestate: str | None
    key: bytes | None


@dataclass(frozen=True, slots=True)
class Refused:
    at: At
    route: BusRoute
    error: DispatcherError
    event_id: str | None
    """None when the record names no one to answer."""
    source: str | None
    key: bytes | None
    dead_letter: bool
    """Unreadable: copied whole to the route's dead-letter topic."""


Read = Request | Refused


def read(
    route: BusRoute, at: At, key: bytes | None, value: bytes | None, headers: Headers, limit: int
) -> Read:
    """What one record asks, or why it is refused."""
    named = _headers(headers)
    event_id, source = _text(named.get("ce_id")), _text(named.get("ce_source"))

    def refused(error: DispatcherError, *, dead_letter: bool) -> Refused:
        answer = event_id is not None and source is not None
        return Refused(
            at, route, error, event_id if answer else None, source if answer else None, key,
            dead_letter,
        )  # fmt: skip

    if value is not None and len(value) > limit:
        return refused(
            PayloadTooLarge(f"the record's value is {len(value)} bytes, over {limit}"),
            dead_letter=True,
        )
    try:
        data = _envelope(named, value)
        if event_id is None or source is None:
            raise UnreadableRecord("ce_id and ce_source must be UTF-8 text")
    except UnreadableRecord as exc:
        return refused(exc, dead_letter=True)
    try:
        submission = _submission(data, route.tenant)
    except DispatcherError as exc:
        return refused(exc, dead_letter=False)
    return Request(
        at, route, event_id, source, submission,
        _text(named.get("ce_traceparent") or named.get("traceparent")),
        _text(named.get("ce_tracestate") or named.get("tracestate")),
        key,
    )  # fmt: skip


def derived_key(source: str, event_id: str) -> str:
    """The idempotency key of a request that names none: its CloudEvent's identity
    (``source`` and ``id`` are unique together, by the spec), so a producer's resend
    of one event lands once. Hashed: any source and id fit the key's contract."""
    # As a JSON pair: no source and id can be shifted into another pair's.
    digest = hashlib.sha256(orjson.dumps([source, event_id])).hexdigest()
    return f"ce-{digest}"


def _headers(headers: Headers) -> dict[str, bytes]:
    # Names are case-insensitive in the binding; a repeated header is ambiguous, and
    # the first one is not more right than the last: both are refused below.
    named: dict[str, bytes] = {}
    for name, value in headers:
        lower = name.lower()
        named[lower] = b"\x00duplicate" if lower in named else value
    return named


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        text = value.decode()
    except UnicodeDecodeError:
        return None
    return text if text and "\x00" not in text else None


def _envelope(named: dict[str, bytes], value: bytes | None) -> dict[str, Any]:
    """The record's data after its envelope was checked by the CloudEvents SDK."""
    attributes = {k: v for k, v in named.items() if k.startswith("ce_") or k == "content-type"}
    if any(v == b"\x00duplicate" for v in attributes.values()):
        raise UnreadableRecord("a ce_ header is repeated")
    try:
        event = from_binary(KafkaMessage(attributes, None, b""), _FORMAT)
    except (BaseCloudEventException, ValueError, TypeError) as exc:
        raise UnreadableRecord(f"not a CloudEvent in the binary binding: {exc}") from None
    if event.get_specversion() != "1.0":
        raise UnreadableRecord("ce_specversion must be 1.0")
    if event.get_type() != SUBMIT:
        raise UnreadableRecord(f"ce_type must be {SUBMIT}, not {event.get_type()!r}")
    content_type = (event.get_datacontenttype() or "application/json").split(";")[0].strip()
    if content_type.lower() not in JSON_TYPES:
        raise UnreadableRecord(f"content-type must be application/json, not {content_type!r}")
    try:
        data = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        raise UnreadableRecord("the record's value is not JSON") from None
    if not isinstance(data, dict):
        raise UnreadableRecord("the record's value is not a JSON object")
    return data


def _submission(data: dict[str, Any], tenant: str) -> SubmitRequest:
    named = data.pop("tenant", tenant)
    if named != tenant:
        # Not echoed: the other tenant's name is not this producer's to learn about.
        raise TenantMismatch("the record names a tenant other than its topic's")
    try:
        return SubmitRequest.model_validate(data)
    except ValidationError as exc:
        errors = [
            {"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors()
        ]
        field = errors[0]["loc"][0] if errors and errors[0]["loc"] else ""
        raise ValidationFailed("the submission is not valid", field=field, errors=errors) from None
