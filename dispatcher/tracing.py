"""The dispatcher's traces: one tracer provider per process from its settings
(:func:`start`), and the attributes every span about a call carries
(:func:`call_attributes`).

Spans, by process (docs/traces.md has the full list):

- API: the FastAPI instrumentation's SERVER span per request (it extracts a
  producer's ``traceparent``); the library's :func:`dispatcher.intake.service.submit`
  opens an INTERNAL ``tool_dispatcher.submit`` span in the caller's current one.
- relay: a PRODUCER ``send <topic>`` span per row (:mod:`outbox_relay.spans`).
- worker: a CONSUMER ``process <topic>`` span per command
  (:mod:`dispatcher.worker.spans`) and a CLIENT span per provider request
  (:mod:`dispatcher.provider.transport`).
- reconciler: ``reconcile lookup``, ``reconcile redispatch`` and ``reconcile
  compensate`` spans in the call's trace (:mod:`reconciler.spans`).

The call's trace context is stored with it (``tool_calls.traceparent``, and the
``traceparent`` header of its outbox rows), so every later step joins the trace.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from dispatcher.settings import Settings
from kit import telemetry

tracer = trace.get_tracer("tool_dispatcher")

Trace = tuple[str, str | None] | None
"""A call's W3C context as stored: ``(traceparent, tracestate)``, or None."""

# The same names as everywhere in the service (events, metrics' labels, logs).
CALL_ATTRIBUTES = {
    "tool_call_id": "tool_dispatcher.tool_call_id",
    "run_id": "tool_dispatcher.run_id",
    "capability_id": "tool_dispatcher.capability_id",
    "status": "tool_dispatcher.status",
}


def service_name(process: str) -> str:
    """``service.name`` of a process (``worker``, ``api``, ``relay``, ...)."""
    return f"tool-dispatcher-{process}"


def start(settings: Settings, process: str) -> bool:
    """Install this process's tracer provider as the settings ask; False when tracing
    is off (nothing installed). ``ValueError`` for a setting that cannot work."""
    return telemetry.install(
        service_name(process), settings.traces_exporter, settings.otlp_endpoint
    )


def call_attributes(call: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """The ``tool_dispatcher.*`` attributes of a call (a ``tool_calls`` row or intake's
    values), and the GenAI tool-execution ones when the producer named the agent's tool
    (``toolName``): the call is then the execution of that tool call."""
    found: dict[str, AttributeValue] = {}
    for column, name in CALL_ATTRIBUTES.items():
        value = call.get(column)
        if value is not None:
            found[name] = str(value)
    tool = call.get("tool_name")
    if tool:
        found["gen_ai.operation.name"] = "execute_tool"
        found["gen_ai.tool.name"] = tool
        found["gen_ai.tool.call.id"] = call["tool_call_id"]
    return found


def trace_headers(trace: tuple[str, str | None]) -> dict[str, str]:
    """The message headers carrying a stored ``(traceparent, tracestate)``."""
    parent, state = trace
    return {"traceparent": parent, "tracestate": state} if state else {"traceparent": parent}


def submitted_in(headers: Mapping[str, str]) -> Trace:
    """The context an HTTP submission is stored with: the API's request span when
    traces are on (the FastAPI instrumentation made it, continuing the producer's
    ``traceparent``); when off, the producer's own valid ``traceparent``, passed on as
    it came, so the provider's requests still join the producer's trace."""
    if telemetry.enabled():
        return telemetry.current_traceparent()
    parent = telemetry.parse_traceparent(headers.get("traceparent"))
    return (parent, headers.get("tracestate") or None) if parent else None


def annotate(view: Any, tool_name: str | None = None) -> None:
    """Put a call's attributes on the current span (an intake span), if it records."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(
            call_attributes(
                {
                    "tool_call_id": view.tool_call_id,
                    "run_id": view.run_id,
                    "capability_id": view.capability_id,
                    "status": view.status,
                    "tool_name": tool_name,
                }
            )
        )


@contextmanager
def submit_span() -> Iterator[Trace]:
    """The library submission's span (``tool_dispatcher.submit``, child of the caller's
    current span) when traces are on, yielding its context; off, the caller's current
    span's context (an application exporting its own spans), if any."""
    if not telemetry.enabled():
        yield telemetry.current_traceparent()
        return
    with tracer.start_as_current_span("tool_dispatcher.submit"):
        yield telemetry.current_traceparent()
