"""`tool-dispatcher reconcile [--once]`.

``--once`` is the cron job: it settles every call due when it starts, prints one line
per outcome class and exits 0; it exits 1 only when the database cannot be reached.
Without ``--once`` it runs pass after pass until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher import runtime
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.engine import create_engine, session_factory
from dispatcher.db.errors import DbErrorClass, classify
from dispatcher.provider.contract import Credentials
from dispatcher.provider.transport import Transport
from dispatcher.settings import Settings
from kit.cli import fail
from kit.signals import stop_on_signals
from reconciler.loop import Reconciler
from tool_dispatcher.ops_server import process_ops
from tool_dispatcher.parsing import require_registry


def register(subparsers: Any) -> None:
    """Add the ``reconcile`` command to the `tool-dispatcher` parser."""
    parser = subparsers.add_parser("reconcile", help="settle calls whose outcome is unknown")
    parser.add_argument("--once", action="store_true", help="one pass (for cron), then exit")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run the reconciler once or until a signal."""
    if settings.database_url is None:
        fail("TOOL_DISPATCHER_DATABASE_URL is not set", 2)
    registry = require_registry(settings)
    try:
        return runtime.run(_main(settings, registry, once=args.once), settings)
    except Exception as exc:
        if classify(exc) is not DbErrorClass.UNAVAILABLE:
            raise
        fail(f"cannot reach the database: {type(exc).__name__}", 1)


@asynccontextmanager
async def reconciler_for(
    settings: Settings, registry: CapabilityRegistry
) -> AsyncIterator[tuple[Reconciler, async_sessionmaker[AsyncSession]]]:
    """A reconciler with its own engine and provider transport (the same kind of pool
    as the worker's, one connection per lookup in flight), closed on exit."""
    engine = create_engine(settings)
    try:
        async with Transport(settings.reconcile_concurrency) as transport:
            sessions = session_factory(engine)
            yield (
                Reconciler(
                    sessions,
                    registry,
                    transport,
                    topics=settings.topics(),
                    batch_size=settings.reconcile_batch_size,
                    concurrency=settings.reconcile_concurrency,
                    lease_seconds=settings.reconcile_lease_seconds,
                    secrets=Credentials.configured(settings),
                ),
                sessions,
            )
    finally:
        await engine.dispose()


async def run_service(
    settings: Settings, registry: CapabilityRegistry, stop: asyncio.Event
) -> None:
    """The reconciler loop until ``stop`` is set: what `python -m devtools up` runs beside
    the API, relay and worker."""
    # Nothing here touches the database before the loop, which outlives an outage: a
    # reconciler (re)started while the database is away waits for it instead of exiting.
    async with reconciler_for(settings, registry) as (reconciler, _):
        await reconciler.run(stop, settings.reconcile_interval_seconds)


async def _main(settings: Settings, registry: CapabilityRegistry, *, once: bool) -> int:
    if once:
        async with reconciler_for(settings, registry) as (reconciler, _):
            tally = await reconciler.run_pass()
        for line in tally.lines():
            print(line)
        return 0
    # Signals first: one arriving while the ops endpoints start still stops cleanly.
    with stop_on_signals(asyncio.Event()) as stop:
        async with process_ops(settings, "reconciler"):
            await run_service(settings, registry, stop)
    return 0
