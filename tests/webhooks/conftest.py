"""Fixtures of the webhook tests: settings with short backoffs, and a sender running in
the test's own event loop against the test's database and real local receivers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from dispatcher.settings import Settings, load_settings
from dispatcher.webhooks.service import run_sender

# Fast enough for a test to watch several retries; the production defaults are 5 s
# doubling to an hour, 12 attempts.
FAST = {
    "backoff_initial_seconds": 0.1,
    "backoff_max_seconds": 0.5,
    "interval_seconds": 0.05,
    "timeout_seconds": 2.0,
    "lease_seconds": 10.0,
}


def webhook_settings(
    database_url: str, subscriptions: list[dict[str, Any]], secrets: dict[str, str], **extra: Any
) -> Settings:
    return load_settings(
        {
            "database_url": database_url,
            "webhooks": {**FAST, "subscriptions": subscriptions, "secrets": secrets, **extra},
        }
    )


@asynccontextmanager
async def sending(settings: Settings) -> AsyncIterator[None]:
    """The sender running for the block, stopped (its POSTs drained) after it."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_sender(settings, stop))
    try:
        yield
    finally:
        stop.set()
        await task


Check = Callable[[], Awaitable[bool]]
