"""The relay's spans: a PRODUCER span per published row (``send <topic>``).

Written by hand rather than by an aiokafka instrumentation: the span must continue and
link to the context stored in the row (the writer's, in its ``traceparent`` header),
not whatever context the relay's loop happens to be in, and the message must carry
that stored context unchanged (the relay copies row headers to Kafka headers), so the
consumer continues the writer's trace rather than the relay's. Only built when
:func:`telemetry.enabled`: the relay checks that once per batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from kit import telemetry
from outbox_relay.kafka import OutboxRow

tracer = trace.get_tracer("outbox_relay")


def _text(headers: Mapping[str, Any], name: str) -> str | None:
    value = headers.get(name)
    return value if isinstance(value, str) else None


def publish_span(row: OutboxRow, topic: str) -> Span:
    """Start the span of sending ``row`` to ``topic``: a child of, and linked to, the
    context stored in the row (a root span when it has none)."""
    headers = row.headers
    parent = telemetry.context_of(_text(headers, "traceparent"), _text(headers, "tracestate"))
    links = []
    if parent is not None:
        links.append(Link(trace.get_current_span(parent).get_span_context()))
    attributes: dict[str, str | int] = {
        "messaging.system": "kafka",
        "messaging.destination.name": topic,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.kafka.message.key": row.key,
        "outbox_relay.row_id": row.id,
    }
    message_id = _text(headers, "ce_id")
    if message_id is not None:
        attributes["messaging.message.id"] = message_id
    return tracer.start_span(
        f"send {topic}",
        context=parent,
        kind=SpanKind.PRODUCER,
        links=links,
        attributes=attributes,
    )


def end_publish_spans(spans: Mapping[int, Span], outcomes: Sequence[object]) -> None:
    """End each row's span (by the row's index) once its outcome is known: acknowledged
    (None), or the error that kept it from the broker."""
    for i, span in spans.items():
        outcome = outcomes[i]
        if isinstance(outcome, BaseException):
            span.set_attribute("error.type", type(outcome).__name__)
            span.set_status(Status(StatusCode.ERROR, type(outcome).__name__))
        span.end()
