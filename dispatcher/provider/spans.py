"""The CLIENT span of a provider request, and the ``traceparent`` it sends.

Written here rather than by an aiohttp instrumentation: the transport is the one place
every provider request passes (dispatch, lookups, compensations), and the header the
provider receives must be the span's own when one records but the call's stable
fallback otherwise (:mod:`dispatcher.provider.client`), which an instrumentation that
injects into every request cannot decide. Attributes follow the HTTP client semantic
conventions; the URL loses any user:password part, and no header is recorded (the
credential travels in one).
"""

from __future__ import annotations

from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from yarl import URL

from dispatcher.tracing import tracer
from kit import telemetry


def client_span(method: str, url: URL) -> Span:
    """Start the span of one request, a child of the current context (the worker's
    consume span, or a reconciler's span)."""
    return tracer.start_span(
        method,
        kind=SpanKind.CLIENT,
        attributes={
            "http.request.method": method,
            "url.full": str(url.with_user(None)),
            "server.address": url.host or "",
            "server.port": url.port or 0,
        },
    )


def traceparent_header(span: Span) -> str | None:
    """The ``traceparent`` the provider receives in this span: the span's own."""
    return telemetry.traceparent_of(span.get_span_context())


def answered(span: Span, status: int) -> None:
    span.set_attribute("http.response.status_code", status)
    if status >= 400:
        # A client span's error is any 4xx or 5xx answer, named by its status code.
        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR))


def failed(span: Span, exc: BaseException) -> None:
    """The request got no answer: the exception's type is the error (never its text,
    which may quote a header)."""
    span.set_attribute("error.type", type(exc).__name__)
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
