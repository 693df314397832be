"""The worker's spans: a CONSUMER span per dispatch command (``process <topic>``),
continuing the context its message carries, and the parent each provider request's
CLIENT span (:mod:`dispatcher.provider.spans`) is started in.

Written by hand rather than by an aiokafka instrumentation: the worker fetches a batch
and executes it as one (one claim transaction, the requests together, one record
transaction), so a span per ``getmany`` or per record delivery would not cover a
command's work; each command's span lives from its fetch until its batch is recorded.
Only built when :func:`telemetry.enabled`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from aiokafka import ConsumerRecord
from opentelemetry import context, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from dispatcher.ledger.messages import DispatchCommand
from dispatcher.states import ExecutionStatus
from dispatcher.tracing import CALL_ATTRIBUTES, call_attributes, tracer
from dispatcher.worker.claims import Claim
from kit import telemetry

CallKey = tuple[str, str]


def _header(headers: Any, name: str) -> str | None:
    for key, value in headers or ():
        if key == name and isinstance(value, bytes):
            return value.decode(errors="replace")
    return None


def consume_span(record: ConsumerRecord[Any, Any], command: DispatchCommand, group: str) -> Span:
    """Start the span of executing ``command``, a child of its message's context (the
    call's: intake's span, or the stored context a re-drive or retry wrote)."""
    parent = telemetry.context_of(
        _header(record.headers, "traceparent"), _header(record.headers, "tracestate")
    )
    return tracer.start_span(
        f"process {record.topic}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "kafka",
            "messaging.destination.name": record.topic,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.consumer.group.name": group,
            "messaging.destination.partition.id": str(record.partition),
            "messaging.kafka.offset": record.offset,
            "messaging.kafka.message.key": command.tool_call_id,
            **call_attributes(
                {
                    "tool_call_id": command.tool_call_id,
                    "run_id": command.run_id,
                    "capability_id": command.capability_id,
                }
            ),
        },
    )


def end_consume_spans(
    spans: Mapping[CallKey, Span],
    statuses: Mapping[CallKey, ExecutionStatus | None],
    error: BaseException | None = None,
) -> None:
    """End each command's span with the status its call was left in (none: a duplicate,
    or a call another worker holds), or the error that failed its batch."""
    for key, span in spans.items():
        status = statuses.get(key)
        if status is not None:
            span.set_attribute(CALL_ATTRIBUTES["status"], status.value)
        if error is not None:
            span.set_attribute("error.type", type(error).__name__)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end()


def parent_context(claim: Claim, parent: Context | None) -> Context | None:
    """The context a claim's provider requests start in: its command's span when one is
    given; else the current one if a span records there (a reconciler's); else the
    call's stored context."""
    if parent is not None:
        return parent
    if trace.get_current_span().is_recording():
        return None
    return telemetry.context_of(claim.traceparent)


@contextmanager
def sending(claim: Claim, parent: Context | None) -> Iterator[None]:
    """Run a claim's send in its parent context (see :func:`parent_context`), with the
    call's attributes (GenAI ones included) on the span that is current there."""
    found = parent_context(claim, parent)
    token = context.attach(found) if found is not None else None
    try:
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes(
                call_attributes(
                    {
                        "tool_call_id": claim.tool_call_id,
                        "run_id": claim.context.run_id,
                        "capability_id": claim.capability.id,
                        "tool_name": claim.tool_name,
                    }
                )
            )
        yield
    finally:
        if token is not None:
            context.detach(token)
