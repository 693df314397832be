"""The API server's deadline for a request head (uvicorn on loopback, raw sockets): a
connection whose request line and headers trickle in is answered 408 and closed, while
the server keeps answering others; keep-alive, pipelining and a body sent after a pause
are not cut by it. Each test waits on what a client observes (an answer, a closed
connection); the bounds only stop a hung test."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import pytest

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.settings import Settings
from tests.fixtures.api import ALICE, bearer, control_keys
from tests.fixtures.capabilities import approval_capability, plain_capability

pytestmark = pytest.mark.postgres

HEAD_TIMEOUT = 1.0
# A trickler sends a header line this often, for ten times the head timeout: far
# slower, all told, than the server allows a head, and each line well within it.
EVERY = 0.25
LINES = int(10 * HEAD_TIMEOUT / EVERY)
TRICKLERS = 5
# Longer than the head timeout, shorter than the keep-alive timeout.
PAUSE = 2 * HEAD_TIMEOUT


@pytest.fixture
def registry() -> CapabilityRegistry:
    caps = [plain_capability("send"), approval_capability("refund-big")]
    return CapabilityRegistry({c.id: c for c in caps})


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "api_keys": control_keys(),
            "http_head_timeout_seconds": HEAD_TIMEOUT,
            "http_keep_alive_seconds": 10,
            "http_body_timeout_seconds": 10.0,
        }
    )


@pytest.fixture
async def address(api_url: str) -> AsyncIterator[tuple[str, int]]:
    parts = urlsplit(api_url)
    assert parts.hostname is not None and parts.port is not None
    yield parts.hostname, parts.port


async def received(reader: asyncio.StreamReader) -> bytes:
    """What the server sends until it closes the connection (a reset counts as closed)."""
    chunks = []
    try:
        while chunk := await reader.read(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


async def trickle(address: tuple[str, int], n: int) -> bytes | None:
    """Send a request's head a line at a time; what the server answered once it closed
    the connection, or None if it was still open when the last line was sent."""
    reader, writer = await asyncio.open_connection(*address)
    closed = asyncio.create_task(received(reader))
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: test\r\n")
        for line in range(LINES):
            done, _ = await asyncio.wait([closed], timeout=EVERY)
            if done:
                return closed.result()
            writer.write(f"X-Trickle-{n}-{line}: still coming\r\n".encode())
        return None
    finally:
        closed.cancel()
        writer.close()


async def test_a_head_that_trickles_is_answered_408_and_closed_while_others_are_served(
    address: tuple[str, int], api: httpx.AsyncClient
) -> None:
    tricklers = [asyncio.create_task(trickle(address, n)) for n in range(TRICKLERS)]
    # While they hold their connections, the server answers everyone else.
    health = await api.get("/healthz")
    assert health.status_code == 200
    assert not any(t.done() for t in tricklers), "a trickler was cut before a health check"

    answers = await asyncio.gather(*tricklers)
    assert None not in answers, "a trickling head was still open after ten head timeouts"
    for answer in answers:
        assert answer is not None
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer
        assert b"connection: close" in head
        assert json.loads(body)["code"] == "request_timeout"


async def test_a_kept_alive_connection_serves_a_request_sent_after_a_pause(
    address: tuple[str, int],
) -> None:
    reader, writer = await asyncio.open_connection(*address)
    try:
        for request in range(2):
            if request:
                # Idle between requests is the keep-alive timer's, not the head's.
                await asyncio.sleep(PAUSE)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
            await writer.drain()
            async with asyncio.timeout(30):
                head = await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(content_length(head))
            assert head.startswith(b"HTTP/1.1 200"), head
    finally:
        writer.close()


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise AssertionError(f"no content-length in {head!r}")


async def test_a_pipelined_head_finished_later_behind_a_slow_answer_is_served(
    address: tuple[str, int], api: httpx.AsyncClient
) -> None:
    body = {"runId": "run-1", "capabilityId": "refund-big", "input": {}, "idempotencyKey": "k"}
    proposed = await api.post("/v1/tool-calls", json=body, headers=bearer(ALICE))
    assert proposed.status_code == 201, proposed.text
    # A call waiting for a human never settles: this long-poll is answered when its
    # wait runs out, well after the head timeout.
    slow = (
        f"GET /v1/tool-calls/{proposed.json()['toolCallId']}?waitSeconds={3 * HEAD_TIMEOUT}"
        f" HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {ALICE}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(*address)
    # Three requests pipelined; the third head is finished in a later read, so its
    # timer is started and must be stopped by its headers, not by any answer.
    writer.write(slow + b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\nGET /healthz HTTP/1.1\r\n")
    await writer.drain()
    await asyncio.sleep(HEAD_TIMEOUT / 5)
    writer.write(b"Host: test\r\nConnection: close\r\n\r\n")
    await writer.drain()
    async with asyncio.timeout(30):
        answer = await received(reader)
    writer.close()
    assert answer.count(b"HTTP/1.1 200") == 3, answer


async def test_a_large_body_sent_after_a_pause_is_the_body_timeouts_not_the_heads(
    address: tuple[str, int],
) -> None:
    payload = json.dumps(
        {
            "runId": "run-1",
            "capabilityId": "send",
            "idempotencyKey": "k-large",
            "input": {"note": "x" * 200_000},
        }
    ).encode()
    reader, writer = await asyncio.open_connection(*address)
    # The head in two pieces, well within its timeout: the server reads it in two
    # reads, so its timer is started.
    writer.write(
        b"POST /v1/tool-calls HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
        + f"Authorization: Bearer {ALICE}\r\nContent-Type: application/json\r\n".encode()
    )
    await writer.drain()
    await asyncio.sleep(HEAD_TIMEOUT / 5)
    writer.write(f"Content-Length: {len(payload)}\r\n\r\n".encode())
    await writer.drain()
    # The head is complete: its timer must be stopped, whatever the body takes.
    await asyncio.sleep(PAUSE)
    writer.write(payload)
    await writer.drain()
    async with asyncio.timeout(30):
        answer = await received(reader)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 201"), answer[:500]
