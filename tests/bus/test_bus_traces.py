"""A call submitted on the bus continues its producer's trace: `bus-intake` as a
process exporting OTLP/HTTP to a receiver inside the test, the record carrying the
producer's ``traceparent`` header."""

from __future__ import annotations

import json
import uuid

import pytest

from devtools.sandbox import SandboxServer
from tests.fixtures.bus import body, headers, producing, rows
from tests.fixtures.otlp import OtlpReceiver
from tests.fixtures.stack import MakeStack
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]

PRODUCER_TRACE = "5cf92f3577b34da6a3ce929d0e0e4737"
PRODUCER_SPAN = "10f067aa0ba902b8"


async def test_a_bus_call_continues_its_producers_trace(
    make_stack: MakeStack, sandbox: SandboxServer, otlp: OtlpReceiver, database_url: str
) -> None:
    topic = f"td-{uuid.uuid4().hex[:8]}.requests.acme"
    stack = make_stack(
        sandbox_url=sandbox.url,
        traces_exporter="otlp",
        otlp_endpoint=otlp.url,
        bus__topics=json.dumps({topic: "acme"}),
        bus__group_id=f"bus-{uuid.uuid4().hex[:8]}",
        ops_port=0,
    )
    stack.env["OTEL_BSP_SCHEDULE_DELAY"] = "100"
    intake = stack.start("bus-intake")
    traced = {"ce_traceparent": f"00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"}
    async with producing(stack.env["TOOL_DISPATCHER_KAFKA_BOOTSTRAP"]) as producer:
        await producer.send_and_wait(
            topic, body("run-t", capabilityId="refund", input={"orderId": "o-9"}),
            headers=headers("traced-1", **traced),
        )  # fmt: skip

    async def stored() -> bool:
        return bool(await rows(database_url, "SELECT 1 FROM tool_calls"))

    await eventually(stored, what="the call to be recorded")

    async def exported() -> bool:
        return any(s.name == "tool_dispatcher.bus_intake" for s in otlp.of_trace(PRODUCER_TRACE))

    await eventually(exported, what="the bus intake span", within=60)
    assert intake.poll() is None, stack.log_of(intake)
    [span] = [s for s in otlp.of_trace(PRODUCER_TRACE) if s.name == "tool_dispatcher.bus_intake"]
    assert (span.service, span.kind, span.parent_id) == (
        "tool-dispatcher-bus-intake",
        "consumer",
        PRODUCER_SPAN,
    )
    assert span.attributes["messaging.destination.name"] == topic
    [(traceparent,)] = await rows(database_url, "SELECT traceparent FROM tool_calls")
    # The call's stored trace is the intake span's: its dispatch and outcome join it.
    assert traceparent == f"00-{PRODUCER_TRACE}-{span.span_id}-01"
