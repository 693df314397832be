"""The provider transport against a real local TCP server that misbehaves on purpose:
what was provably not sent, what may have been received, and that nothing is ever
sent twice behind the caller's back (aiohttp's silent retry, redirects). The server
counts every request it read, so "sent once" is observed, not assumed."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from devtools.embedded import free_port
from dispatcher.capabilities import Capability
from dispatcher.provider.client import DispatchRequest, OutcomeKind, ProviderClient
from dispatcher.provider.transport import MaybeReceived, NotSent, Transport
from tests.fixtures.local_server import LocalServer

OK = b'{"status":"succeeded","externalRequestId":"ext-1","result":{}}'
# What the server does with the n-th request it read (1-based), on connection c.
Behaviour = Callable[[int, int], str]


class Provider(LocalServer):
    """An HTTP/1.1 server on a local port; every request read is counted in
    ``requests`` as (connection number, method, path) before it meets its fate."""

    def __init__(self, behave: Behaviour) -> None:
        super().__init__()
        self.behave = behave
        self.requests: list[tuple[int, str, str]] = []
        self._stop = asyncio.Event()

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await super().__aexit__(*exc)

    async def _handle(
        self, connection: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                method, path, _ = head.split(b" ", 2)
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                self.requests.append((connection, method.decode(), path.decode()))
                action = self.behave(len(self.requests), connection)
                if action == "answer":
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(OK), OK)
                    )
                elif action == "redirect":
                    writer.write(
                        b"HTTP/1.1 307 Temporary Redirect\r\nlocation: /elsewhere\r\n"
                        b"content-length: 0\r\n\r\n"
                    )
                elif action == "reset":
                    # SO_LINGER 0: close with a TCP reset, the request read and unanswered.
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                elif action == "close":
                    return
                elif action == "slow":
                    await asyncio.sleep(0.05)
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                elif action == "hang":
                    await self._stop.wait()
                    return
                await writer.drain()
        finally:
            writer.close()


@pytest.fixture
async def transport() -> AsyncIterator[Transport]:
    async with Transport(4) as t:
        yield t


def cap(url: str, *, method: str = "POST", side_effects: bool = True, timeout: float = 2.0) -> Any:
    return Capability.model_validate(
        {
            "id": "c",
            "sideEffects": side_effects,
            "request": {"url": f"{url}/v1/requests", "method": method, "timeoutSeconds": timeout},
            "retry": {"maxAttempts": 3, "initialBackoffSeconds": 0.001, "maxBackoffSeconds": 0.01},
        }
    )


REQUEST = DispatchRequest("tc-1", "k-1", {"n": 1}, "tc-1", tenant="acme")


async def send(transport: Transport, url: str, method: str = "POST", seconds: float = 2.0) -> Any:
    body = b"{}" if method != "GET" else None
    return await transport.send(
        method,
        f"{url}/v1/requests",
        headers={"Idempotency-Key": "k"},
        body=body,
        timeout_seconds=seconds,
    )


async def test_nothing_listening_is_not_sent_and_retried(transport: Transport) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(NotSent) as raised:
        await send(transport, url)
    assert type(raised.value.__cause__).__name__ == "ClientConnectorError"

    outcome = await ProviderClient(transport).dispatch(cap(url), REQUEST)
    assert (outcome.kind, outcome.attempts) == (OutcomeKind.NOT_SENT, 3)
    assert outcome.error == "not sent: ClientConnectorError"


async def test_a_failed_tls_handshake_is_not_sent(transport: Transport) -> None:
    """The server takes the TCP connection and drops it on the ClientHello: not a byte
    of the HTTP request was written."""
    received: list[bytes] = []

    async def handshake_then_drop(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        received.append(await reader.read(5))
        w.close()

    server = await asyncio.start_server(handshake_then_drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(NotSent):
            await send(transport, f"https://127.0.0.1:{port}")
    finally:
        server.close()
        await server.wait_closed()
    assert received and received[0][:1] == b"\x16"  # a TLS handshake record, no request


async def test_a_connect_that_never_completes_is_a_connect_timeout_not_sent(
    transport: Transport,
) -> None:
    """A listener that never accepts, its backlog full: the kernel drops our SYNs, so
    the connection never opens and the connect budget runs out."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    backlog = [socket.socket() for _ in range(4)]
    try:
        for sock in backlog:
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.connect(("127.0.0.1", port))
        with pytest.raises(NotSent) as raised:
            await send(transport, f"http://127.0.0.1:{port}", seconds=0.2)
    finally:
        for sock in [*backlog, listener]:
            sock.close()
    assert type(raised.value.__cause__).__name__ == "ConnectionTimeoutError"


@pytest.mark.parametrize("method", ["POST", "PUT"])
async def test_a_reset_after_the_request_was_read_is_unknown_and_never_resent(
    transport: Transport, method: str
) -> None:
    async with Provider(lambda n, c: "reset") as provider:
        with pytest.raises(MaybeReceived):
            await send(transport, provider.url, method)
        outcome = await ProviderClient(transport).dispatch(
            cap(provider.url, method=method), REQUEST
        )

    assert outcome.kind is OutcomeKind.UNKNOWN
    assert outcome.attempts == 1
    # One request per send: neither aiohttp nor the client sent either again.
    assert [m for _, m, _ in provider.requests] == [method, method]


async def test_a_read_only_call_is_repeated_after_a_reset(transport: Transport) -> None:
    async with Provider(lambda n, c: "reset" if n < 3 else "answer") as provider:
        outcome = await ProviderClient(transport).dispatch(
            cap(provider.url, side_effects=False), REQUEST
        )
    assert (outcome.kind, outcome.attempts) == (OutcomeKind.COMPLETED, 3)
    assert len(provider.requests) == 3


async def test_no_answer_is_a_read_timeout_and_may_have_been_received(
    transport: Transport,
) -> None:
    async with Provider(lambda n, c: "hang") as provider:
        with pytest.raises(MaybeReceived) as raised:
            await send(transport, provider.url, seconds=0.2)
        assert type(raised.value.__cause__).__name__ == "SocketTimeoutError"
        outcome = await ProviderClient(transport).dispatch(cap(provider.url, timeout=0.2), REQUEST)
    assert (outcome.kind, outcome.attempts) == (OutcomeKind.UNKNOWN, 1)
    assert outcome.error == "sent, no answer: SocketTimeoutError"
    assert len(provider.requests) == 2


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
async def test_a_kept_alive_connection_dropped_under_a_request_is_not_silently_retried(
    transport: Transport, method: str
) -> None:
    """aiohttp re-sends an idempotent method once when a reused connection fails; a PUT
    may be a side effect. The second request is read, then its connection dropped."""
    async with Provider(lambda n, c: "answer" if n == 1 else "close") as provider:
        first = await send(transport, provider.url, method)
        with pytest.raises(MaybeReceived) as raised:
            await send(transport, provider.url, method)
    assert first.status == 200
    assert type(raised.value.__cause__).__name__ == "ServerDisconnectedError"
    # Both on the first connection (it was reused), and no third request anywhere.
    assert [(c, m) for c, m, _ in provider.requests] == [(1, method), (1, method)]


async def test_a_redirect_is_answered_not_followed(transport: Transport) -> None:
    async with Provider(lambda n, c: "redirect") as provider:
        reply = await send(transport, provider.url)
    assert (reply.status, reply.headers["Location"]) == (307, "/elsewhere")
    assert [p for _, _, p in provider.requests] == ["/v1/requests"]


async def test_requests_beyond_the_pool_wait_for_a_connection_and_reuse_it() -> None:
    """Waiting for a free connection is not connecting: it never turns into "not sent",
    however long it takes (here eight answers of 50 ms each, one at a time, against a
    connect budget of 200 ms), and the one pooled connection is kept alive."""
    async with Transport(1) as transport, Provider(lambda n, c: "slow") as provider:
        replies = await asyncio.gather(
            *(send(transport, provider.url, seconds=0.2) for _ in range(8))
        )
    assert [r.status for r in replies] == [200] * 8
    assert {c for c, _, _ in provider.requests} == {1}
