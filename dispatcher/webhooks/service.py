"""The sender as a service: a pass every ``interval_seconds`` until stopped, then the
POSTs in flight are let finish (each bounded by its timeout) before the process ends."""

from __future__ import annotations

import asyncio

import aiohttp

from dispatcher.db.engine import create_engine, session_factory
from dispatcher.settings import Settings
from dispatcher.webhooks.sender import Sender
from kit.owners import owner_id
from kit.periodic import periodic

LOOP = "webhooks"
"""The ``loop`` label of the sender's step metrics and the name in its log lines."""


async def run_sender(settings: Settings, stop: asyncio.Event, *, once: bool = False) -> None:
    """Deliver webhooks until ``stop`` is set (``once``: one pass, its POSTs awaited)."""
    engine = create_engine(settings)
    conf = settings.webhooks
    # One pool for every receiver, a connection per POST in flight at most. No limit per
    # host: two tenants' receivers on one host (a chat service's) must not wait on each
    # other; the sender bounds each subscription itself.
    connector = aiohttp.TCPConnector(limit=conf.concurrency, limit_per_host=0)
    try:
        async with aiohttp.ClientSession(connector=connector) as http:
            sender = Sender.start(
                session_factory(engine), conf, owner=owner_id("webhooks"), http=http
            )
            try:
                await sender.settle_unconfigured()
                if once:
                    await sender.step()
                else:
                    await periodic(stop, conf.interval_seconds, sender.step, name=LOOP)
            finally:
                await sender.drain()
    finally:
        await engine.dispose()
