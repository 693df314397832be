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

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

import telemetry
from dispatcher.settings import Settings

tracer = trace.get_tracer("tool_dispatcher")

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
