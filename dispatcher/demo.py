"""`tool-dispatcher demo`: the intake story on the embedded defaults, end to end over
real HTTP, with a short readable summary. Exits non-zero if any step surprised it."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from dispatcher.capabilities import load_registry
from dispatcher.embedded import free_port
from dispatcher.serving import api_server, wait_started
from dispatcher.settings import Settings
from dispatcher.stack import local_stack


@dataclass
class Step:
    title: str
    expected_status: int
    status: int
    detail: str

    @property
    def ok(self) -> bool:
        return self.status == self.expected_status


async def run_demo(settings: Settings) -> int:
    registry = load_registry(settings.capabilities_file)
    async with local_stack(settings) as stack:
        port = free_port(stack.settings.http_host)
        server = api_server(stack.settings, registry, port=port, install_signal_handlers=False)
        task = asyncio.create_task(server.serve())
        await wait_started(server, task)
        base = f"http://{stack.settings.http_host}:{port}"
        key = stack.dev_api_key or ""
        print("tool-dispatcher demo")
        for line in stack.started:
            print(f"  started {line}")
        print(f"  API     {base}")
        try:
            steps = await _story(base, key)
        finally:
            server.should_exit = True
            await task
    print()
    for step in steps:
        mark = "ok " if step.ok else "FAIL"
        print(f"  [{mark}] {step.title:<58} HTTP {step.status}  {step.detail}")
    failed = [s for s in steps if not s.ok]
    print()
    print(f"{len(steps) - len(failed)} of {len(steps)} steps behaved as expected")
    return 1 if failed else 0


async def _story(base: str, key: str) -> list[Step]:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    intent = f"refund-intent-{uuid.uuid4().hex[:6]}"
    refund = {
        "runId": run_id,
        "turnId": "turn-001",
        "capabilityId": "refund-order-v2",
        "correlationId": intent,
        "input": {"orderId": "order-001", "amount": 42.5},
    }
    steps: list[Step] = []
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=10
    ) as client:

        async def post(title: str, body: dict[str, Any], expected: int) -> dict[str, Any]:
            response = await client.post("/v1/tool-calls", json=body)
            data: dict[str, Any] = response.json()
            detail = (
                f"{data.get('toolCallId')} status={data.get('status')} "
                f"key={data.get('idempotencyKey')}"
                if response.is_success
                else f"code={data.get('code')}"
            )
            steps.append(Step(title, expected, response.status_code, detail))
            return data

        first = await post("submit a refund", refund, 201)
        again = await post("submit the same refund again (idempotent replay)", refund, 200)
        if again.get("toolCallId") != first.get("toolCallId"):
            steps.append(Step("the replay returns the same toolCallId", 200, 0, "mismatch"))
        changed = {**refund, "input": {"orderId": "order-001", "amount": 999}}
        await post("reuse the refund's key for a different amount", changed, 422)
        await post(
            "send an email in the same run",
            {
                "runId": run_id,
                "turnId": "turn-002",
                "capabilityId": "send-email",
                "input": {"to": "customer@example.com", "template": "refund-issued"},
            },
            201,
        )
        await post(
            "a refund that needs a human approval",
            {
                "runId": run_id,
                "turnId": "turn-003",
                "capabilityId": "refund-order-approved",
                "input": {"orderId": "order-002", "amount": 5000},
            },
            201,
        )
        await post(
            "an unknown capability",
            {"runId": run_id, "capabilityId": "launch-rockets", "input": {}},
            404,
        )
        events = await client.get(f"/v1/runs/{run_id}/events")
        log = events.json().get("events", [])
        steps.append(
            Step(
                "read the run's event log",
                200,
                events.status_code,
                f"{len(log)} events: "
                + ", ".join(e["eventType"].removeprefix("tool.call.") for e in log),
            )
        )
        anonymous = await client.get(
            f"/v1/tool-calls/{first.get('toolCallId')}", headers={"Authorization": "Bearer wrong"}
        )
        steps.append(
            Step(
                "read with a wrong API key",
                401,
                anonymous.status_code,
                f"code={anonymous.json().get('code')}",
            )
        )
    return steps
