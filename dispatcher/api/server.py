"""Running the API under uvicorn inside the current event loop."""

from __future__ import annotations

import asyncio
import contextlib

import uvicorn
from sqlalchemy.ext.asyncio import AsyncEngine
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from dispatcher.api import create_app
from dispatcher.api.problems import answer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.errors import RequestTimeout
from dispatcher.settings import Settings


class IdleClosingProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol (httptools, which uvicorn[standard] brings) with two
    timers uvicorn lacks.

    The keep-alive timer is also started when a connection opens: uvicorn starts it only
    after an answer, so a client that connects and never sends a byte would hold its
    socket for ever. The first byte received cancels it, as after an answer.

    The head timer bounds how long a request's head (request line and headers) may take
    to arrive: uvicorn has none, and the first byte cancels the keep-alive timer, so a
    client sending a header line now and then would hold its connection for ever. It starts
    at the first byte of a head (on a new connection or after the previous request's
    body) and stops when httptools has parsed the headers; the body has its own
    deadline (dispatcher.api.middleware.BodyLimit). It is armed only when a head spans
    more than one read, so a request whose head comes in one piece costs no timer.
    """

    timeout_head: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Between two requests: the next byte received begins a head.
        self._between_requests = True
        self._in_head = False
        self._head_timer: asyncio.TimerHandle | None = None
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # Bytes between requests start a head even when httptools sees none yet: a
        # client sending only blank lines would otherwise cancel the keep-alive timer
        # with each one and start nothing.
        self._in_head = self._in_head or self._between_requests
        super().data_received(data)
        if self._in_head and self._head_timer is None and not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.timeout_head, self._head_timed_out)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True

    def on_headers_complete(self) -> None:
        self._between_requests = self._in_head = False
        self._stop_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._between_requests = True

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:
            # The server stopped reading (a pipelined request waits for the one before
            # it, whose handler reads nothing more): the rest of the head may be sitting
            # unread in the socket, so the client is not late; wait again.
            self._head_timer = self.loop.call_later(self.timeout_head, self._head_timed_out)
            return
        # A 408 only when no answer is being written: it would land inside that one.
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(self._request_timeout())
        self.transport.close()

    def _request_timeout(self) -> bytes:
        problem = answer(
            RequestTimeout(
                f"the request head did not arrive within {self.timeout_head:g} s",
                timeoutSeconds=self.timeout_head,
            )
        )
        headers = [
            *self.server_state.default_headers,
            *problem.raw_headers,
            (b"connection", b"close"),
        ]
        lines = [STATUS_LINE[408], *(name + b": " + value + b"\r\n" for name, value in headers)]
        return b"".join([*lines, b"\r\n", problem.body])


def protocol(head_timeout: float) -> type[IdleClosingProtocol]:
    """The protocol class of a server whose request heads must arrive within
    ``head_timeout`` seconds (uvicorn makes one instance per connection from a class)."""
    return type("IdleClosingProtocol", (IdleClosingProtocol,), {"timeout_head": head_timeout})


def api_server(
    settings: Settings,
    registry: CapabilityRegistry,
    *,
    engine: AsyncEngine | None = None,
    port: int | None = None,
    install_signal_handlers: bool = True,
) -> uvicorn.Server:
    config = uvicorn.Config(
        create_app(settings, registry, engine),
        host=settings.http_host,
        port=settings.http_port if port is None else port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        # An idle connection (kept alive after an answer, or never sending a request)
        # is closed after this long, a slow head after http_head_timeout_seconds; a
        # slow body is BodyLimit's (dispatcher.api.middleware).
        timeout_keep_alive=settings.http_keep_alive_seconds,
        http=protocol(settings.http_head_timeout_seconds),
    )
    server = uvicorn.Server(config)
    if not install_signal_handlers:
        # The caller owns signals (the demo, tests): uvicorn must not take them over.
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    return server


async def wait_started(server: uvicorn.Server, task: asyncio.Task[None]) -> None:
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("the API server stopped while starting")
        await asyncio.sleep(0.01)
