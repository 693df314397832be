"""Running the API under uvicorn inside the current event loop."""

from __future__ import annotations

import asyncio
import contextlib

import uvicorn
from sqlalchemy.ext.asyncio import AsyncEngine
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from dispatcher.api import create_app
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.settings import Settings


class IdleClosingProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol (httptools, which uvicorn[standard] brings), with the
    keep-alive timer also started when a connection opens: uvicorn starts it only after
    an answer, so a client that connects and never sends a byte would hold its socket
    for ever. The first byte received cancels the timer, as after an answer."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )


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
        # is closed after this long; a slow body is BodyLimit's (dispatcher.api.middleware).
        timeout_keep_alive=settings.http_keep_alive_seconds,
        http=IdleClosingProtocol,
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
