"""What a real local server receives from the provider transport, byte for byte: the
method, the body, the Content-Type, every header the caller passed, no cookie carried
over, no proxy taken from the environment, the connections it may open at once; and
what a closed transport does. The failure classes are tests/worker/test_provider_transport.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from dispatcher.provider.transport import Transport
from tests.fixtures.local_server import LocalServer

ANSWER = (
    b"HTTP/1.1 200 OK\r\nset-cookie: session=s1; Path=/\r\n"
    b"content-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
)


@dataclass(frozen=True)
class Received:
    connection: int
    method: str
    path: str
    headers: list[tuple[str, str]]
    """As sent: names in the sender's case, in its order, repeats kept."""
    body: bytes

    def values(self, name: str) -> list[str]:
        return [v for n, v in self.headers if n.lower() == name.lower()]


class Recorder(LocalServer):
    """An HTTP/1.1 server that records each request as it arrived, then answers it once
    ``answer_after`` requests have arrived (so requests in flight at once can be seen)."""

    def __init__(self, answer_after: int = 1) -> None:
        super().__init__()
        self.received: list[Received] = []
        self._answer_after = answer_after
        self._enough = asyncio.Event()

    async def _handle(
        self, connection: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                first, *lines = head.decode("ascii").split("\r\n")[:-2]
                method, path, _ = first.split(" ", 2)
                headers = [(n, v.strip()) for n, v in (line.split(":", 1) for line in lines)]
                length = sum(int(v) for n, v in headers if n.lower() == "content-length")
                body = await reader.readexactly(length)
                self.received.append(Received(connection, method, path, headers, body))
                if len(self.received) >= self._answer_after:
                    self._enough.set()
                await self._enough.wait()
                writer.write(ANSWER)
                await writer.drain()
        finally:
            writer.close()


@pytest.fixture
async def transport() -> AsyncIterator[Transport]:
    async with Transport(4) as t:
        yield t


async def test_the_server_receives_the_method_body_json_type_and_every_header(
    transport: Transport,
) -> None:
    headers = {"Idempotency-Key": "refund:o-1", "Authorization": "Bearer t0k", "X-Tab": "a\tb"}
    async with Recorder() as server:
        reply = await transport.send(
            "PATCH", f"{server.url}/v1/r?x=1", headers=headers, body=b'{"n":1}', timeout_seconds=2
        )
    assert (reply.status, reply.body) == (200, b"{}")
    [got] = server.received
    assert (got.method, got.path, got.body) == ("PATCH", "/v1/r?x=1", b'{"n":1}')
    # Exactly one Content-Type, written as the transport names it.
    assert [(n, v) for n, v in got.headers if n.lower() == "content-type"] == [
        ("Content-Type", "application/json")
    ]
    for name, value in headers.items():
        assert (name, value) in got.headers
    # The caller's mapping is not changed by the Content-Type added for the send.
    assert "Content-Type" not in headers


async def test_a_request_without_a_body_carries_neither_body_nor_content_type(
    transport: Transport,
) -> None:
    async with Recorder() as server:
        await transport.send("GET", f"{server.url}/v1/r/1", headers={"A": "1"}, timeout_seconds=2)
    [got] = server.received
    assert (got.method, got.body, got.values("Content-Type")) == ("GET", b"", [])
    assert got.values("A") == ["1"]


async def test_a_providers_cookie_is_never_sent_back(transport: Transport) -> None:
    async with Recorder() as server:
        # By host name: aiohttp's ordinary cookie jar would refuse a cookie from an IP.
        url = server.url.replace("127.0.0.1", "localhost")
        for _ in range(2):
            await transport.send("POST", url, headers={}, body=b"{}", timeout_seconds=2)
    assert [r.values("Cookie") for r in server.received] == [[], []]
    # One kept-alive connection for both.
    assert [r.connection for r in server.received] == [1, 1]


async def test_a_proxy_named_in_the_environment_is_not_used(
    transport: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with Recorder() as proxy, Recorder() as server:
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.setenv(name, proxy.url)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        await transport.send("POST", f"{server.url}/x", headers={}, body=b"{}", timeout_seconds=2)
    assert (len(server.received), proxy.received) == (1, [])


async def test_requests_to_one_host_are_in_flight_together_up_to_the_pool() -> None:
    """No per-host limit below the pool's: three requests to one provider are all on the
    wire before the first is answered, each on a connection of its own."""
    async with Transport(3) as transport, Recorder(answer_after=3) as server:
        replies = await asyncio.gather(
            *(
                transport.send("POST", server.url, headers={}, body=b"{}", timeout_seconds=2)
                for _ in range(3)
            )
        )
    assert [r.status for r in replies] == [200] * 3
    assert sorted(r.connection for r in server.received) == [1, 2, 3]


async def test_a_closed_transport_refuses_and_stays_closed() -> None:
    transport = Transport()
    async with Recorder() as server:
        await transport.send("GET", server.url, headers={}, timeout_seconds=2)
        await transport.close()
        await transport.close()  # closing twice is fine
        for _ in range(2):
            with pytest.raises(RuntimeError) as raised:
                await transport.send("GET", server.url, headers={}, timeout_seconds=2)
            assert str(raised.value) == "the provider transport is closed"
    assert len(server.received) == 1


async def test_a_transport_closed_before_any_send_never_opens() -> None:
    transport = Transport()
    await transport.close()
    try:
        async with Recorder() as server:
            with pytest.raises(RuntimeError):
                await transport.send("GET", server.url, headers={}, timeout_seconds=2)
    finally:
        await transport.close()
    assert server.received == []
    assert transport._session is None
