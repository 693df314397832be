"""`python -m devtools demo`: the refund story, end to end on the embedded
defaults and over real HTTP — intake, relay, worker, sandbox provider, reconciler —
with a short readable summary. Exits non-zero if any step surprised it."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from devtools.embedded import free_port
from devtools.local import DEV_TENANT, all_services, local_stack
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import load_registry
from dispatcher.settings import Settings
from dispatcher.tenancy import provider_key


@dataclass
class Step:
    title: str
    expected: str
    got: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.got == self.expected


def demo_capabilities(sandbox: str) -> str:
    """The sandbox's capabilities with a reconcile policy quick enough for a demo."""
    endpoints = (
        f'request = {{ method = "POST", url = "{sandbox}/v1/requests", timeoutSeconds = 2 }}\n'
        f'statusLookup = {{ method = "GET", url = "{sandbox}/v1/requests/{{externalRequestId}}", '
        "timeoutSeconds = 0.5 }\n"
        f'lookupByKey = {{ method = "GET", '
        f'url = "{sandbox}/v1/requests?idempotencyKey={{idempotencyKey}}", '
        "timeoutSeconds = 0.5 }\n"
        "reconcile = { maxAttempts = 3, initialDelaySeconds = 0.2, maxDelaySeconds = 0.5 }\n"
    )
    return (
        '[[capability]]\nid = "refund-order-v2"\nsideEffects = true\nrisk = "high"\n'
        'idempotencyKeyTemplate = "refund:{input.orderId}:{correlationId}"\n'
        + endpoints
        + '\n[[capability]]\nid = "refund-order-approved"\nsideEffects = true\n'
        'requiresApproval = true\nrisk = "high"\n'
        + endpoints
        + '\n[[capability]]\nid = "send-email"\nsideEffects = true\n'
        + endpoints
    )


async def run_demo(settings: Settings) -> int:
    async with local_stack(settings) as stack, SandboxServer() as sandbox:
        caps = stack.settings.state_dir / "demo-capabilities.toml"
        caps.write_text(demo_capabilities(sandbox.url))
        resolved = stack.settings.model_copy(
            update={
                "capabilities_file": caps,
                "reconcile_interval_seconds": 0.2,
                "http_port": free_port(stack.settings.http_host),
            }
        )
        registry = load_registry(caps)
        print("python -m devtools demo")
        for line in stack.started:
            print(f"  started {line}")
        print(f"  started sandbox provider {sandbox.url}")
        async with all_services(resolved, registry) as lines:
            for line in lines:
                print(f"  {line}")
            base = f"http://{resolved.http_host}:{resolved.http_port}"
            steps, paths, effects = await _story(base, stack.dev_api_key or "", sandbox.url)
    print()
    for step in steps:
        mark = "ok " if step.ok else "FAIL"
        print(f"  [{mark}] {step.title:<55} {step.got:<24} {step.detail}")
    print()
    print("  path of each call:")
    width = max(map(len, paths))
    for name, path in paths.items():
        print(f"    {name:<{width}}  {' -> '.join(path)}")
    print()
    print("  sandbox effects per idempotency key (never more than 1):")
    for key, count in sorted(effects.items()):
        print(f"    {key:<44} {count}")
    failed = [s for s in steps if not s.ok]
    print()
    print(f"{len(steps) - len(failed)} of {len(steps)} steps behaved as expected")
    return 1 if failed else 0


async def _story(
    base: str, api_key: str, sandbox: str
) -> tuple[list[Step], dict[str, list[str]], dict[str, int]]:
    async with (
        httpx.AsyncClient(
            base_url=base, timeout=10, headers={"Authorization": f"Bearer {api_key}"}
        ) as api,
        httpx.AsyncClient(base_url=sandbox, timeout=10) as provider,
    ):
        story = _Story(api, provider)
        await story.plant_faults()
        await story.submit_all()
        await story.decide_twice()
        await story.stop_a_run()
        return await story.settle()


class _Story:
    """The demo's steps, in order; each appends what it saw to :attr:`steps`."""

    def __init__(self, api: httpx.AsyncClient, provider: httpx.AsyncClient) -> None:
        self.api, self.provider = api, provider
        self.run_id = f"run-{uuid.uuid4().hex[:8]}"
        self.tag = uuid.uuid4().hex[:6]
        self.steps: list[Step] = []
        self.calls: dict[str, str] = {}
        self.runs: dict[str, str] = {}

    async def plant_faults(self) -> None:
        # The provider will lose the answer to the second refund, and will never answer
        # a lookup about the third one. The demo submits as the dev key's tenant, and
        # the provider receives each key qualified by it.
        lost = provider_key(DEV_TENANT, f"refund:order-002:intent-{self.tag}")
        silent = provider_key(DEV_TENANT, f"refund:order-003:intent-{self.tag}")
        await self.provider.post(
            "/v1/faults",
            json=[
                {"kind": "drop_after_apply", "idempotencyKey": lost, "method": "POST"},
                {"kind": "drop_after_apply", "idempotencyKey": silent, "method": "POST"},
                {"kind": "timeout", "idempotencyKey": silent, "method": "GET", "seconds": 3},
            ],
        )

    async def submit(
        self, name: str, body: dict[str, Any], expected: int, run: str | None = None
    ) -> dict[str, Any]:
        run = run or self.run_id
        response = await self.api.post("/v1/tool-calls", json={"runId": run, **body})
        data: dict[str, Any] = response.json()
        detail = data.get("idempotencyKey") or data.get("code", "")
        self.steps.append(Step(name, f"HTTP {expected}", f"HTTP {response.status_code}", detail))
        if response.status_code == 201:
            self.calls[name] = data["toolCallId"]
            self.runs[name] = run
        return data

    def refund(self, order: str) -> dict[str, Any]:
        return {
            "capabilityId": "refund-order-v2",
            "correlationId": f"intent-{self.tag}",
            "input": {"orderId": order, "amount": 42.5},
        }

    async def submit_all(self) -> None:
        submit, refund = self.submit, self.refund
        first = await submit("refund order-001", refund("order-001"), 201)
        again = await submit("the same refund again (idempotent replay)", refund("order-001"), 200)
        if again.get("toolCallId") != first.get("toolCallId"):
            self.steps.append(Step("the replay names the same call", "same", "different"))
        await submit(
            "reuse that key for another amount",
            {**refund("order-001"), "input": {"orderId": "order-001", "amount": 999}},
            422,
        )
        await submit("refund order-002 (provider drops the answer)", refund("order-002"), 201)
        await submit("refund order-003 (lookups never answer)", refund("order-003"), 201)
        await submit(
            "send the refund email",
            {"capabilityId": "send-email", "input": {"to": "customer@example.com"}},
            201,
        )
        await submit(
            "a large refund that needs approval",
            {
                "capabilityId": "refund-order-approved",
                "input": {"orderId": "order-004", "amount": 5000},
            },
            201,
        )
        await submit("an unknown capability", {"capabilityId": "launch-rockets", "input": {}}, 404)

    async def decide_twice(self) -> None:
        # A human decides the large refund, once and only once.
        pending = (await self.api.get("/v1/approvals", params={"status": "pending"})).json()
        approval = next(
            a["approvalId"]
            for a in pending["approvals"]
            if a["toolCallId"] == self.calls["a large refund that needs approval"]
        )
        for title, code in (("approve the large refund", 200), ("approve it a second time", 409)):
            decided = await self.api.post(
                f"/v1/approvals/{approval}/decision",
                json={"decision": "approve", "reason": "checked by finance"},
            )
            answer = decided.json()
            self.steps.append(
                Step(
                    title,
                    f"HTTP {code}",
                    f"HTTP {decided.status_code}",
                    answer.get("code") or answer.get("status", ""),
                )
            )

    async def stop_a_run(self) -> None:
        # An operator stops another run while its call still waits for a decision.
        other = f"run-{uuid.uuid4().hex[:8]}"
        gated = {
            "capabilityId": "refund-order-approved",
            "input": {"orderId": "order-005", "amount": 800},
        }
        await self.submit("queue a refund in a second run", gated, 201, run=other)
        stopped = await self.api.post(
            f"/v1/runs/{other}/stop", json={"reason": "customer withdrew"}
        )
        self.steps.append(Step("stop the second run", "HTTP 200", f"HTTP {stopped.status_code}"))
        await self.submit("submit to the stopped run", gated, 409, run=other)

    async def settle(self) -> tuple[list[Step], dict[str, list[str]], dict[str, int]]:
        """Wait for every call's final status; the steps, each call's path and the
        sandbox's effects per key."""
        calls = self.calls
        expected = {
            "refund order-001": "completed",
            "refund order-002 (provider drops the answer)": "confirmed",
            "refund order-003 (lookups never answer)": "escalated",
            "send the refund email": "completed",
            "a large refund that needs approval": "completed",
            "queue a refund in a second run": "cancelled",
        }
        finals = await _wait_for(self.api, {calls[n]: s for n, s in expected.items()})
        for name, want in expected.items():
            self.steps.append(Step(f"{name}: settles", want, finals.get(calls[name], "?")))
        escalations = (await self.api.get("/v1/escalations")).json()
        open_ids = [e.get("toolCallId") for e in escalations.get("escalations", [])]
        listed = calls["refund order-003 (lookups never answer)"] in open_ids
        self.steps.append(
            Step(
                "order-003 waits in the escalation queue",
                "listed",
                "listed" if listed else "missing",
            )
        )
        paths = {name: await _path(self.api, self.runs[name], calls[name]) for name in expected}
        effects: dict[str, int] = (await self.provider.get("/v1/effects")).json()["effects"]
        return self.steps, paths, effects


async def _wait_for(
    api: httpx.AsyncClient, wanted: dict[str, str], within: float = 45.0
) -> dict[str, str]:
    """Poll the calls until each shows its expected status (or time runs out)."""
    deadline = time.monotonic() + within
    seen: dict[str, str] = {}
    while time.monotonic() < deadline:
        for call in wanted:
            seen[call] = (await api.get(f"/v1/tool-calls/{call}")).json().get("status", "?")
        if seen == wanted:
            break
        await asyncio.sleep(0.2)
    return seen


async def _path(api: httpx.AsyncClient, run_id: str, call: str) -> list[str]:
    """The statuses a call went through, read back from the run's event log."""
    events = (await api.get(f"/v1/runs/{run_id}/events")).json()["events"]
    path: list[str] = []
    for event in events:
        if event["toolCallId"] != call:
            continue
        if event["eventType"] == "tool.call.requested":
            path.append("proposed" if event["payload"].get("requiresApproval") else "requested")
        elif event["eventType"] == "tool.call.authorized":
            path.append("authorized")
        elif "to" in event["payload"]:
            path.append(event["payload"]["to"])
    return path
