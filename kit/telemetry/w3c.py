"""W3C trace context as stored text: a ``traceparent`` (and ``tracestate``) kept in a
database row or a message header, read back into a parent context later, in another
process.

Parsing and formatting are the API's own W3C propagator, so what is stored is exactly
what would travel in an HTTP or Kafka header.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_W3C = TraceContextTextMapPropagator()


def traceparent_of(span_context: SpanContext) -> str | None:
    """The ``traceparent`` of ``span_context``; None when it is not a valid one."""
    if not span_context.is_valid:
        return None
    sampled = int(span_context.trace_flags) & 0x01
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{sampled:02x}"


def current_traceparent() -> tuple[str, str | None] | None:
    """``(traceparent, tracestate or None)`` of the current span, None without one."""
    span_context = trace.get_current_span().get_span_context()
    parent = traceparent_of(span_context)
    if parent is None:
        return None
    state = span_context.trace_state.to_header() or None
    return parent, state


def context_of(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """A parent context continuing the stored ``traceparent``; None when there is none
    or it is not a valid W3C traceparent (then a span started "in" it is a root)."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    found = _W3C.extract(carrier)
    if not trace.get_current_span(found).get_span_context().is_valid:
        return None
    return found


def parse_traceparent(text: str | None) -> str | None:
    """``text`` when it is a valid W3C traceparent (normalised), else None: what a
    producer sent, checked before it is stored."""
    found = context_of(text)
    if found is None:
        return None
    return traceparent_of(trace.get_current_span(found).get_span_context())
