"""Pure ASGI middleware: the request body limit and per-route latency metrics.

Pure ASGI rather than Starlette's BaseHTTPMiddleware: the latter wraps errors raised
while a body is read into exception groups and costs a task per request.
"""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dispatcher.api.problems import answer
from dispatcher.errors import PayloadTooLarge, RequestTimeout
from dispatcher.metrics import HTTP_REQUEST_SECONDS


class BodyLimit:
    """Refuses a body over ``max_bytes`` with 413 before the application sees any of
    it, and a body that has not fully arrived ``timeout`` seconds after the headers
    with 408 (and closes the connection): a slow client would otherwise hold a
    connection and a task for as long as it likes. A declared Content-Length over the
    limit is refused at once; any other body is buffered (it is bounded by the limit)
    and replayed to the application."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float = 10.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send, drained=True)
            return
        try:
            async with asyncio.timeout(self.timeout):
                body = await self._read(scope, receive, send)
        except TimeoutError:
            response = answer(
                RequestTimeout(
                    f"the body did not arrive within {self.timeout:g} s",
                    timeoutSeconds=self.timeout,
                )
            )
            response.headers["connection"] = "close"
            await response(scope, receive, send)
            return
        if body is not None:
            await self.app(scope, _replay([body], then=receive), send)

    async def _read(self, scope: Scope, receive: Receive, send: Send) -> Message | None:
        """The whole body as one message, or None once the request was answered here."""
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                # The client went away: let the application see that.
                await self.app(scope, _replay([message]), send)
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                drained = await self._drain(receive, message)
                await self._refuse(scope, receive, send, drained=drained)
                return None
            chunks.append(chunk)
            more = message.get("more_body", False)
        return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

    async def _drain(self, receive: Receive, last: Message) -> bool:
        """Read and discard the rest of a refused body (up to a bound), so the client,
        which is still sending, gets to read the 413 instead of a connection reset."""
        discarded = 0
        while last.get("more_body", False):
            if discarded > 8 * self.max_bytes:
                return False
            last = await receive()
            if last["type"] != "http.request":
                return False
            discarded += len(last.get("body", b""))
        return True

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, *, drained: bool) -> None:
        response = answer(
            PayloadTooLarge(
                f"the body is larger than {self.max_bytes} bytes", maxBytes=self.max_bytes
            )
        )
        if not drained:
            response.headers["connection"] = "close"
        await response(scope, receive, send)


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is None:
            return {"type": "http.disconnect"}
        return await then()

    return receive


class RequestTiming:
    """Observes each request's latency by route template and status class."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def observing_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observing_send)
        finally:
            # Starlette's router records the matched route in the shared scope.
            route = getattr(scope.get("route"), "path", "unmatched")
            HTTP_REQUEST_SECONDS.labels(route, f"{status // 100}xx").observe(
                time.perf_counter() - started
            )
