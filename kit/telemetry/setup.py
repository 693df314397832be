"""One tracer provider per process, from the process's settings.

The OpenTelemetry API is a no-op until a provider is installed, and it can be installed
only once per process: :func:`install` is called by each entry point (the dispatcher's
CLI, ``python -m outbox_relay``) before anything starts, and :func:`shutdown` flushes
the spans still queued when the process ends.
"""

from __future__ import annotations

from typing import Literal

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

Exporter = Literal["none", "console", "otlp"]

_installed: TracerProvider | None = None


def enabled() -> bool:
    """True once this process exports spans: the one check a hot loop makes before
    creating any (the API's no-op spans still cost a few microseconds each)."""
    return _installed is not None


def _exporter(kind: Exporter, endpoint: str | None) -> SpanExporter:
    if kind == "console":
        return ConsoleSpanExporter()
    if endpoint is None:
        raise ValueError("the otlp traces exporter needs an endpoint (its /v1/traces URL)")
    # Imported here: it brings requests and protobuf, which a process exporting nothing
    # has no use for.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint)


def install(
    service_name: str,
    exporter: Exporter | SpanExporter,
    endpoint: str | None = None,
) -> bool:
    """Install the provider exporting this process's spans as ``service_name``, batched
    (BatchSpanProcessor: spans leave on a thread of their own, never on the event
    loop). ``"none"`` installs nothing; False then, and the API stays a no-op. A
    :class:`SpanExporter` of the caller's own is used as it is (the benchmarks' own,
    which drops every span).

    ``ValueError`` for ``otlp`` without an endpoint; a second call is refused the same
    way (the API keeps the first provider)."""
    global _installed
    if exporter == "none":
        return False
    if _installed is not None:
        raise ValueError("a tracer provider is already installed in this process")
    chosen = exporter if isinstance(exporter, SpanExporter) else _exporter(exporter, endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(chosen))
    trace.set_tracer_provider(provider)
    _installed = provider
    return True


def shutdown() -> None:
    """Export the spans still queued, then stop (the end of the process)."""
    if _installed is not None:
        _installed.shutdown()
