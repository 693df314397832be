"""A capability paused for one tenant, on the real API, two workers, the relay and the
reconciler: its calls stay ``authorized`` (nothing reaches the provider, no attempt is
spent) across a worker killed and restarted and several redrive periods, the other
tenant's calls of the same capability go through meanwhile, and on resume each waiting
call completes exactly once, with its same key."""

from __future__ import annotations

import asyncio
import json
import signal

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.embedded import free_port
from devtools.sandbox import SandboxServer
from dispatcher.db.tables import tool_calls
from dispatcher.settings import hash_api_key
from tests.fixtures.sandbox import at_provider, books
from tests.fixtures.stack import MakeStack, ProcessStack
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow, pytest.mark.process]

Sessions = async_sessionmaker[AsyncSession]
KEYS = {"acme": "tdk_pause_acme", "globex": "tdk_pause_globex"}
CALLS = 20


@pytest.fixture
def stack(make_stack: MakeStack, sandbox: SandboxServer) -> ProcessStack:
    keys = [
        {"sha256": hash_api_key(raw), "tenant": tenant, "scopes": ["submit", "read", "operate"]}
        for tenant, raw in KEYS.items()
    ]
    return make_stack(
        sandbox_url=sandbox.url,
        http_port=free_port(),
        api_keys=json.dumps(keys),
        # Redrive every half second for calls authorized over a second: a paused call
        # waits through many of its periods.
        redrive_after_seconds=1,
        redrive_interval_seconds=0.5,
        reconcile_interval_seconds=0.5,
    )


def client(stack: ProcessStack, tenant: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{stack.env['TOOL_DISPATCHER_HTTP_PORT']}",
        headers={"Authorization": f"Bearer {KEYS[tenant]}"},
        timeout=30,
    )


async def submit(api: httpx.AsyncClient, tenant: str) -> list[str]:
    keys = [f"{tenant}-pause-{i}" for i in range(CALLS)]
    for key in keys:
        body = {"runId": "r", "capabilityId": "refund", "idempotencyKey": key, "input": {}}
        reply = await api.post("/v1/tool-calls", json=body)
        assert reply.status_code == 201, reply.text
    return keys


async def calls_of(sessions: Sessions, tenant: str) -> list[tuple[str, int]]:
    async with sessions() as session:
        rows = await session.execute(
            select(tool_calls.c.status, tool_calls.c.dispatch_attempts).where(
                tool_calls.c.tenant == tenant
            )
        )
        return [(r.status, r.dispatch_attempts) for r in rows]


async def test_paused_calls_wait_through_a_worker_restart_and_go_once_on_resume(
    stack: ProcessStack, sessions: Sessions, sandbox: SandboxServer
) -> None:
    api = stack.start("serve")
    workers = [stack.start("worker", name=f"worker-{i}") for i in range(2)]
    stack.start("relay")
    stack.start("reconcile")
    async with client(stack, "acme") as acme, client(stack, "globex") as globex:

        async def up() -> bool:
            assert api.poll() is None, stack.log_of(api)
            try:
                return (await acme.get("/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(up, what="the API to be ready")
        paused = await acme.post("/v1/capabilities/refund/pause", json={"reason": "provider down"})
        assert paused.status_code == 200, paused.text
        held, passed = await submit(acme, "acme"), await submit(globex, "globex")

        async def globex_done() -> bool:
            return [s for s, _ in await calls_of(sessions, "globex")] == ["completed"] * CALLS

        await eventually(globex_done, what="the other tenant's calls to complete")
        # A worker killed and another started while the calls wait; redrive periods go by.
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait()
        stack.start("worker", name="worker-2")
        await asyncio.sleep(5)
        assert await calls_of(sessions, "acme") == [("authorized", 0)] * CALLS
        received = (await books(sandbox.url))["received"]
        assert not [k for k in held if at_provider(k) in received]
        listed = (await acme.get("/v1/capabilities")).json()["capabilities"]
        assert [(c["status"], c["waiting"]) for c in listed if c["capabilityId"] == "refund"] == [
            ("paused", CALLS)
        ]

        resumed = await acme.post("/v1/capabilities/refund/resume", json={"reason": "back"})
        assert resumed.json()["changed"] is True

        async def acme_done() -> bool:
            return await calls_of(sessions, "acme") == [("completed", 1)] * CALLS

        await eventually(acme_done, what="the waiting calls to complete after the resume")
    provider = await books(sandbox.url)
    for key in [*held, *passed]:
        tenant = key.split("-", 1)[0]
        assert provider["received"][at_provider(key, tenant)] == 1, key
        assert provider["effects"][at_provider(key, tenant)] == 1, key
