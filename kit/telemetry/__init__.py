"""OpenTelemetry plumbing shared by every process: install a tracer provider once
(:func:`install`), and move W3C trace context in and out of stored text.

The lowest layer (below :mod:`outbox_relay`): it knows OpenTelemetry and nothing of
outboxes or tool calls, so the relay and the dispatcher both use it. Off unless
:func:`install` was given an exporter; :func:`enabled` is the cheap flag the hot loops
check before building any span.
"""

from kit.telemetry.setup import Exporter, enabled, install, shutdown
from kit.telemetry.w3c import context_of, current_traceparent, parse_traceparent, traceparent_of

__all__ = [
    "Exporter",
    "context_of",
    "current_traceparent",
    "enabled",
    "install",
    "parse_traceparent",
    "shutdown",
    "traceparent_of",
]
