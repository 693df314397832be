"""The end-to-end trace: API, relay, worker and reconciler as processes
exporting OTLP/HTTP to a receiver inside the test, the sandbox as the provider.

One call, submitted with a producer's ``traceparent``, whose answer the provider drops
(so the reconciler settles it): one trace id covers the API's request span, the relay's
publish span (linked to the intake context), the worker's consume span, its provider
request and the reconciler's lookup, and the sandbox received that trace's
``traceparent`` from the client span. No span holds the provider credential or the
API key (the secret canary of tests/worker/test_provider_credentials.py, for spans:
an interpreter installs its tracer provider once, so spans are checked as real
processes export them). With traces off nothing is exported, and each call's provider
requests still share one traceparent across attempts.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.embedded import free_port, wait_for_port
from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.db.tables import tool_calls
from dispatcher.logs import TRANSITIONS_LOGGER
from dispatcher.provider.client import traceparent
from tests.fixtures.capabilities import registry_file
from tests.fixtures.otlp import OtlpReceiver, ReceivedSpan
from tests.fixtures.sandbox import add_fault, at_provider, books
from tests.fixtures.stack import API_KEY, MakeStack, ProcessStack
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]

SECRET = "sk_live_trace_canary_0123456789"
PRODUCER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_SPAN = "00f067aa0ba902b7"
PRODUCER_TRACEPARENT = f"00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"


def _stack(make_stack: MakeStack, sandbox: SandboxServer, **settings: Any) -> ProcessStack:
    stack = make_stack(
        sandbox_url=sandbox.url,
        http_port=free_port(),
        provider_secrets=json.dumps({"refund": SECRET}),
        reconcile_interval_seconds=0.3,
        **settings,
    )
    # The SDK's own knob (it reads OTEL_* itself): export every 100 ms, not every 5 s.
    stack.env["OTEL_BSP_SCHEDULE_DELAY"] = "100"
    # A refund the reconciler can look up by key: a dropped answer names no request id.
    refund = capability("refund", sandbox.url, by_key=True, reconcile={})
    stack.env["TOOL_DISPATCHER_CAPABILITIES_FILE"] = str(
        registry_file(stack.tmp, registry_of(refund))
    )
    return stack


async def _start(stack: ProcessStack, *commands: str) -> dict[str, subprocess.Popen[bytes]]:
    stack.start("serve")
    await asyncio.to_thread(
        wait_for_port, "127.0.0.1", int(stack.env["TOOL_DISPATCHER_HTTP_PORT"]), timeout=60
    )
    return {command: stack.start(command) for command in commands}


async def _submit(stack: ProcessStack, key: str, headers: dict[str, str] | None = None) -> str:
    base = f"http://127.0.0.1:{stack.env['TOOL_DISPATCHER_HTTP_PORT']}"
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        response = await client.post(
            "/v1/tool-calls",
            json={
                "runId": "run-traced",
                "capabilityId": "refund",
                "idempotencyKey": key,
                "input": {"orderId": key},
                "toolName": "refund_order",
            },
            headers={"Authorization": f"Bearer {API_KEY}", **(headers or {})},
        )
    assert response.status_code == 201, response.text
    return str(response.json()["toolCallId"])


async def _status_is(sessions: async_sessionmaker[AsyncSession], call: str, status: str) -> bool:
    async with sessions() as session:
        found = await session.scalar(
            select(tool_calls.c.status).where(tool_calls.c.tool_call_id == call)
        )
    return found == status


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.split("\n") if line.startswith("{")]


def _one(spans: list[ReceivedSpan], service: str, kind: str, name: str = "") -> ReceivedSpan:
    found = [
        s for s in spans if s.service == service and s.kind == kind and s.name.startswith(name)
    ]
    assert len(found) == 1, (service, kind, name, spans)
    return found[0]


async def test_one_trace_from_the_producer_to_the_reconciler(
    make_stack: MakeStack,
    sandbox: SandboxServer,
    otlp: OtlpReceiver,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    stack = _stack(
        make_stack, sandbox, traces_exporter="otlp", otlp_endpoint=otlp.url, log_format="json"
    )
    key = "refund:traced-1"
    await add_fault(
        sandbox.url,
        {
            "kind": "drop_after_apply",
            "idempotencyKey": at_provider(key),
            "method": "POST",
            "times": 1,
        },
    )
    processes = await _start(stack, "relay", "worker", "reconcile")
    call = await _submit(stack, key, {"traceparent": PRODUCER_TRACEPARENT})
    await eventually(
        lambda: _status_is(sessions, call, "confirmed"), within=90, what="the reconciler"
    )

    async def all_exported() -> bool:
        services = {(s.service, s.kind) for s in otlp.of_trace(PRODUCER_TRACE)}
        return {
            ("tool-dispatcher-api", "server"),
            ("tool-dispatcher-relay", "producer"),
            ("tool-dispatcher-worker", "consumer"),
            ("tool-dispatcher-worker", "client"),
            ("tool-dispatcher-reconciler", "internal"),
            ("tool-dispatcher-reconciler", "client"),
        } <= services

    await eventually(all_exported, within=30, what="every process's spans")
    spans = otlp.of_trace(PRODUCER_TRACE)
    intake = _one(spans, "tool-dispatcher-api", "server")
    assert intake.parent_id == PRODUCER_SPAN
    assert intake.attributes["tool_dispatcher.tool_call_id"] == call
    assert intake.attributes["tool_dispatcher.status"] == "authorized"
    assert intake.attributes["gen_ai.operation.name"] == "execute_tool"
    assert intake.attributes["gen_ai.tool.name"] == "refund_order"

    # The command's publish span, linked to (and in) the intake context.
    [publish] = [
        s
        for s in spans
        if s.kind == "producer"
        and s.attributes["messaging.destination.name"] == stack.topics["dispatch"]
    ]
    assert publish.links == [(PRODUCER_TRACE, intake.span_id)]
    assert publish.attributes["messaging.system"] == "kafka"

    consume = _one(spans, "tool-dispatcher-worker", "consumer")
    assert consume.parent_id == intake.span_id
    assert consume.attributes["tool_dispatcher.status"] == "result_unknown"
    assert consume.attributes["gen_ai.tool.call.id"] == call
    client = _one(spans, "tool-dispatcher-worker", "client")
    assert client.parent_id == consume.span_id
    assert client.attributes["http.request.method"] == "POST"
    assert client.attributes["error.type"]  # the answer was dropped

    lookup = _one(spans, "tool-dispatcher-reconciler", "internal", "reconcile lookup")
    assert lookup.parent_id == intake.span_id
    asked = _one(spans, "tool-dispatcher-reconciler", "client")
    assert asked.parent_id == lookup.span_id

    # The provider saw the client spans' own traceparents: the send's, then the lookup's.
    sent = (await books(sandbox.url))["traceparents"][at_provider(key)]
    assert sent == [f"00-{PRODUCER_TRACE}-{s.span_id}-01" for s in (client, asked)]

    # The JSON log lines of the call's transitions are in the same trace: the worker's
    # (authorized -> dispatching -> result_unknown) and the reconciler's settling.
    for name, moves in (("worker", 2), ("reconcile", 1)):
        lines = [
            line
            for line in _json_lines(stack.log_of(processes[name]))
            if line["logger"] == TRANSITIONS_LOGGER and line.get("tool_call_id") == call
        ]
        assert len(lines) >= moves, (name, lines)
        assert {line.get("trace_id") for line in lines} == {PRODUCER_TRACE}, (name, lines)

    texts = {str(v) for s in otlp.spans for v in s.attributes.values()} | otlp.resource_texts
    texts |= {s.name for s in otlp.spans}
    assert not any(SECRET in t or API_KEY in t for t in texts)


async def test_traces_off_exports_nothing_and_keeps_one_traceparent_per_call(
    make_stack: MakeStack,
    sandbox: SandboxServer,
    otlp: OtlpReceiver,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    # The endpoint is set, the exporter is not: nothing may be sent.
    stack = _stack(make_stack, sandbox, otlp_endpoint=otlp.url)
    plain, traced = "refund:untraced-1", "refund:untraced-2"
    # One 503 with Retry-After each: every call is sent twice.
    await add_fault(
        sandbox.url,
        [
            {"kind": "unavailable", "retryAfter": 0, "times": 1, "idempotencyKey": at_provider(k)}
            for k in (plain, traced)
        ],
    )
    await _start(stack, "relay", "worker")
    calls = [
        await _submit(stack, plain),
        await _submit(stack, traced, {"traceparent": PRODUCER_TRACEPARENT}),
    ]
    for call in calls:
        await eventually(lambda c=call: _status_is(sessions, c, "completed"), what=call)

    sent = (await books(sandbox.url))["traceparents"]
    # Derived from the call when the producer sent none; the producer's, passed on.
    assert sent[at_provider(plain)] == [traceparent(calls[0])] * 2
    assert sent[at_provider(traced)] == [PRODUCER_TRACEPARENT] * 2
    await asyncio.sleep(0.5)  # past the export delay the stack is given
    assert otlp.requests == 0 and otlp.spans == []
