"""The sandbox provider's HTTP/1.1 server: h11 on asyncio streams.

Not an ASGI app on purpose: the faults that matter most to an at-most-once dispatcher
act on the TCP connection (apply the effect, then close or reset the socket without a
response; hold it open without answering), and ASGI servers give an application no way
to do that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from dataclasses import dataclass
from http import HTTPStatus
from types import TracebackType
from urllib.parse import parse_qsl, urlsplit

import h11

from devtools.sandbox.faults import FaultKind, FaultSpecError
from devtools.sandbox.pgstore import PostgresStore
from devtools.sandbox.provider import Incoming, Provider, Reply, fault_reply, problem
from devtools.sandbox.store import MemoryStore, SandboxStore

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
_READ_CHUNK = 64 * 1024
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_JSON = (b"content-type", b"application/json")


@dataclass(frozen=True)
class _Drop:
    """Close the connection without a response (``reset``: with a TCP RST)."""

    reset: bool = False


@dataclass(frozen=True)
class _Hold:
    """Say nothing for ``seconds`` (None: until the client or the server gives up)."""

    seconds: float | None


class SandboxServer:
    """The sandbox provider listening on ``host:port`` (port 0 picks a free one).

    ``async with SandboxServer() as server:`` starts it and stops it; ``server.url`` is
    its base URL. State is in memory unless ``database_url`` names a PostgreSQL database.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        database_url: str | None = None,
        store: SandboxStore | None = None,
    ) -> None:
        if store is None:
            store = MemoryStore() if database_url is None else PostgresStore(database_url)
        self.host = host
        self._requested_port = port
        self.provider = Provider(store)
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._stopping = asyncio.Event()
        # Connection task -> busy (handling a request) or idle (waiting for one).
        self._connections: dict[asyncio.Task[None], bool] = {}

    @property
    def store(self) -> SandboxStore:
        return self.provider.store

    @property
    def port(self) -> int:
        """The port actually listened on (known once started)."""
        if self._port is None:
            raise RuntimeError("the sandbox server is not started")
        return self._port

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8790``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Open the store (creating its tables) and start listening."""
        self._stopping.clear()
        await self.store.open()
        try:
            self._server = await asyncio.start_server(
                self._connection, self.host, self._requested_port, backlog=1024
            )
        except BaseException:
            await self.store.close()
            raise
        self._port = self._server.sockets[0].getsockname()[1]

    async def stop(self, grace: float = 2.0) -> None:
        """Stop listening, let requests in progress finish for up to ``grace`` seconds,
        close every connection and the store."""
        if self._server is None:
            return
        server, self._server = self._server, None
        self._stopping.set()
        server.close()
        for task, busy in list(self._connections.items()):
            if not busy:
                task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=grace)
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections))
        await server.wait_closed()
        await self.store.close()

    async def __aenter__(self) -> SandboxServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # noqa: S101 - always inside a task here
        self._connections[task] = False
        graceful = False
        try:
            graceful = await self._serve(task, reader, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client left, or the server is stopping: nothing to answer
        finally:
            self._connections.pop(task, None)
            if graceful:
                writer.close()  # flushes what is still buffered, then closes
            else:
                writer.transport.abort()

    async def _serve(
        self, task: asyncio.Task[None], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer requests until the connection ends; False when it must be dropped."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_READ_CHUNK)
        while True:
            self._connections[task] = False
            try:
                incoming = await _read_request(conn, reader)
            except h11.RemoteProtocolError as exc:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    status = exc.error_status_hint
                    _send(conn, writer, problem(status, "bad_request", str(exc)), close=True)
                    await writer.drain()
                return True
            except _TooLarge:
                reply = problem(413, "invalid_request", f"the body exceeds {MAX_BODY_BYTES} bytes")
                _send(conn, writer, reply, close=True)
                await writer.drain()
                return True
            if incoming is None:
                return True
            self._connections[task] = True
            outcome = await self._outcome(incoming)
            if isinstance(outcome, _Hold):
                await self._hold(reader, outcome.seconds)
                return False
            if isinstance(outcome, _Drop):
                if outcome.reset:
                    # Linger 0 turns close() into an RST: the client reads ECONNRESET.
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return False
            _send(conn, writer, outcome, close=self._stopping.is_set())
            await writer.drain()
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return True
            conn.start_next_cycle()

    async def _outcome(self, incoming: Incoming) -> Reply | _Drop | _Hold:
        provider = self.provider
        try:
            fault = provider.fault_for(incoming)
        except FaultSpecError as exc:
            return problem(400, "invalid_fault", str(exc))
        if fault is None:
            return await self._apply(incoming)
        kind = fault.kind
        if kind is FaultKind.LATENCY:
            await asyncio.sleep(fault.latency_ms / 1000)
            return await self._apply(incoming)
        if kind in (FaultKind.ERROR, FaultKind.RATE_LIMIT, FaultKind.UNAVAILABLE):
            return fault_reply(fault)
        if kind is FaultKind.DROP_BEFORE_APPLY:
            return _Drop(fault.reset)
        if kind is FaultKind.DROP_AFTER_APPLY:
            await self._apply(incoming)
            return _Drop(fault.reset)
        if fault.apply:
            await self._apply(incoming)
        return _Hold(fault.seconds)

    async def _apply(self, incoming: Incoming) -> Reply:
        try:
            return await self.provider.handle(incoming)
        except Exception:  # a store failure must become a 500, not a hung connection
            log.exception("sandbox: %s %s failed", incoming.method, incoming.path)
            return problem(500, "internal_error", "the sandbox failed to process the request")

    async def _hold(self, reader: asyncio.StreamReader, seconds: float | None) -> None:
        async def until_eof() -> None:
            while await reader.read(_READ_CHUNK):
                pass

        waiters = {
            asyncio.ensure_future(until_eof()),
            asyncio.ensure_future(self._stopping.wait()),
        }
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await asyncio.gather(*waiters, return_exceptions=True)


class _TooLarge(Exception):
    """The request body exceeds :data:`MAX_BODY_BYTES`."""


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        conn.receive_data(await reader.read(_READ_CHUNK))


async def _read_request(conn: h11.Connection, reader: asyncio.StreamReader) -> Incoming | None:
    """The next complete request, or None when the client closed the connection."""
    event = await _next_event(conn, reader)
    if not isinstance(event, h11.Request):  # ConnectionClosed: the client left
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        part = await _next_event(conn, reader)
        if isinstance(part, h11.Data):
            size += len(part.data)
            if size > MAX_BODY_BYTES:
                raise _TooLarge
            chunks.append(part.data)
        elif isinstance(part, h11.EndOfMessage):
            break
        else:
            return None
    target = urlsplit(event.target.decode("ascii", "replace"))
    return Incoming(
        method=event.method.decode("ascii"),
        path=target.path,
        query=dict(parse_qsl(target.query)),
        headers={k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers},
        body=b"".join(chunks),
    )


def _send(conn: h11.Connection, writer: asyncio.StreamWriter, reply: Reply, *, close: bool) -> None:
    headers = [_JSON, (b"content-length", str(len(reply.body)).encode())]
    headers.extend((k.encode(), v.encode()) for k, v in reply.headers)
    if close:
        headers.append((b"connection", b"close"))
    response = h11.Response(
        status_code=reply.status, headers=headers, reason=_REASONS.get(reply.status, b"")
    )
    writer.write(
        b"".join(
            (
                conn.send(response) or b"",
                conn.send(h11.Data(data=reply.body)) or b"",
                conn.send(h11.EndOfMessage()) or b"",
            )
        )
    )


async def serve_sandbox(
    host: str,
    port: int,
    *,
    database_url: str | None = None,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the sandbox provider until ``stop`` is set (forever if None).

    ``ready`` is set once it listens. With ``database_url`` (a libpq URL) its state is
    kept in PostgreSQL schema ``sandbox`` and survives a restart.
    """
    server = SandboxServer(host, port, database_url=database_url)
    await server.start()
    try:
        if ready is not None:
            ready.set()
        await (stop or asyncio.Event()).wait()
    finally:
        await server.stop()
