"""Running the API under uvicorn inside the current event loop."""

from __future__ import annotations

import asyncio
import contextlib

import uvicorn
from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.api import create_app
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.settings import Settings


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
