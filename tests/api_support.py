"""The real API for tests: uvicorn on a free loopback port, inside the test's own event
loop, with API keys for two tenants and a read-only key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.api.server import api_server, wait_started
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.settings import ApiKey, Settings, hash_api_key
from dispatcher.testing.embedded import free_port

ACME_KEY = "tdk_test_acme_submit_and_read"
ACME_READ_ONLY_KEY = "tdk_test_acme_read_only"
GLOBEX_KEY = "tdk_test_globex_submit_and_read"


def api_keys() -> list[ApiKey]:
    """Configured hashes of the three test keys."""
    return [
        ApiKey(sha256=hash_api_key(ACME_KEY), tenant="acme", scopes=["submit", "read"]),
        ApiKey(sha256=hash_api_key(ACME_READ_ONLY_KEY), tenant="acme", scopes=["read"]),
        ApiKey(sha256=hash_api_key(GLOBEX_KEY), tenant="globex", scopes=["submit", "read"]),
    ]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@asynccontextmanager
async def running_api(
    settings: Settings, registry: CapabilityRegistry, engine: AsyncEngine | None = None
) -> AsyncIterator[str]:
    """Serve the app until the block ends; yields its base URL."""
    port = free_port(settings.http_host)
    server = api_server(settings, registry, engine=engine, port=port, install_signal_handlers=False)
    task = asyncio.create_task(server.serve())
    try:
        await wait_started(server, task)
        yield f"http://{settings.http_host}:{port}"
    finally:
        server.should_exit = True
        await task
