"""The front door's limits over the real API (uvicorn on loopback, real PostgreSQL):
a per-tenant submission rate, a per-tenant cap on held long-polls, a deadline for a
request body, and idle connections closed. Each waits on what a client observes (an
answer, a closed connection), never on a wall-clock threshold."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import execution_events, outbox, tool_calls
from dispatcher.settings import Settings
from tests.fixtures.api import ALICE, GLOBEX, bearer, control_keys
from tests.fixtures.capabilities import approval_capability, plain_capability
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.postgres

BURST = 3
LONG_POLLS = 2


@pytest.fixture
def registry() -> CapabilityRegistry:
    caps = [plain_capability("send"), approval_capability("refund-big")]
    return CapabilityRegistry({c.id: c for c in caps})


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "api_keys": control_keys(),
            # So slow that no token comes back during the test.
            "submit_rate_per_second": 0.001,
            "submit_burst": BURST,
            "long_polls_per_tenant": LONG_POLLS,
            "http_body_timeout_seconds": 0.5,
            "http_keep_alive_seconds": 1,
        }
    )


def body(n: int, cap: str = "send") -> dict[str, Any]:
    return {"runId": "run-1", "capabilityId": cap, "input": {"n": n}, "idempotencyKey": f"k-{n}"}


async def counts(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        return {
            t.name: (await conn.execute(select(func.count()).select_from(t))).scalar_one()
            for t in (tool_calls, execution_events, outbox)
        }


def assert_rate_limited(reply: httpx.Response) -> None:
    assert reply.status_code == 429, reply.text
    assert reply.headers["content-type"].startswith("application/problem+json")
    assert reply.json()["code"] == "rate_limited"
    retry_after = reply.headers["retry-after"]
    assert retry_after.isdigit() and int(retry_after) >= 1
    assert reply.json()["retryAfterSeconds"] == int(retry_after)


async def test_the_submission_past_the_burst_is_refused_and_writes_nothing(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    for n in range(BURST):
        reply = await api.post("/v1/tool-calls", json=body(n), headers=bearer(ALICE))
        assert reply.status_code == 201, reply.text
    before = await counts(engine)

    refused = await api.post("/v1/tool-calls", json=body(BURST), headers=bearer(ALICE))
    assert_rate_limited(refused)
    assert await counts(engine) == before

    # Another tenant's bucket is its own.
    other = await api.post("/v1/tool-calls", json=body(BURST), headers=bearer(GLOBEX))
    assert other.status_code == 201, other.text
    # Reads are not submissions.
    read = await api.get("/v1/tool-calls/" + other.json()["toolCallId"], headers=bearer(GLOBEX))
    assert read.status_code == 200


async def test_a_long_poll_past_the_cap_is_answered_at_once_with_429(
    api: httpx.AsyncClient,
) -> None:
    proposed = await api.post("/v1/tool-calls", json=body(1, "refund-big"), headers=bearer(ALICE))
    assert proposed.status_code == 201, proposed.text
    path = "/v1/tool-calls/" + proposed.json()["toolCallId"]
    # A call waiting for a human never settles: these hold until their wait runs out.

    def hold() -> asyncio.Task[httpx.Response]:
        return asyncio.create_task(
            api.get(path, params={"waitSeconds": 20}, headers=bearer(ALICE), timeout=60)
        )

    held = [hold() for _ in range(LONG_POLLS)]
    try:
        # A short probe gets in until both are held. While it is in, a held one may
        # find the cap reached and be refused: it is sent again.
        async with asyncio.timeout(30):
            while True:
                resent = [i for i, task in enumerate(held) if task.done()]
                for i in resent:
                    assert held[i].result().status_code == 429
                    held[i] = hold()
                if resent:
                    # Let it land first: a probe sent with it, on a kept-alive
                    # connection while it opens a new one, reached the server first
                    # every time and took the slot it was refused for, to the end.
                    await asyncio.sleep(0.2)
                reply = await api.get(path, params={"waitSeconds": 0.05}, headers=bearer(ALICE))
                if reply.status_code == 429:
                    break
                assert reply.status_code == 200, reply.text
        assert_rate_limited(reply)
        assert not any(t.done() for t in held)
        # A plain read is not a long-poll; another tenant's cap is its own (its 404
        # is answered after the slot was taken, so it got past the cap).
        assert (await api.get(path, headers=bearer(ALICE))).status_code == 200
        other = await api.get(path, params={"waitSeconds": 0.05}, headers=bearer(GLOBEX))
        assert other.status_code == 404
    finally:
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)

    # Clients that went away give their slots back before their wait would have ended.
    async def admitted() -> bool:
        reply = await api.get(path, params={"waitSeconds": 0.05}, headers=bearer(ALICE))
        return reply.status_code == 200

    await eventually(admitted, what="a long-poll admitted once the held ones went away")


@pytest.fixture
async def address(api_url: str) -> AsyncIterator[tuple[str, int]]:
    parts = urlsplit(api_url)
    assert parts.hostname is not None and parts.port is not None
    yield parts.hostname, parts.port


async def read_all(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (the bound only stops
    a hung test)."""
    async with asyncio.timeout(30):
        return await reader.read()


async def test_a_body_that_trickles_is_answered_408_and_the_connection_closed(
    address: tuple[str, int],
) -> None:
    reader, writer = await asyncio.open_connection(*address)
    payload = json.dumps(body(1)).encode()
    writer.write(
        b"POST /v1/tool-calls HTTP/1.1\r\nHost: test\r\n"
        + f"Authorization: Bearer {ALICE}\r\nContent-Type: application/json\r\n".encode()
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload[:5]
    )
    await writer.drain()
    answer = await read_all(reader)  # the rest of the body never comes
    writer.close()
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert b"application/problem+json" in head
    assert json.loads(rest)["code"] == "request_timeout"


async def test_a_connection_that_sends_nothing_is_closed(address: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*address)
    assert await read_all(reader) == b""
    writer.close()


async def test_an_idle_keep_alive_connection_is_closed(address: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*address)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
    await writer.drain()
    answer = await read_all(reader)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer
