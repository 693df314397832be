"""`tool-dispatcher reconcile [--once]`, added to the dispatcher's command through the
``tool_dispatcher.commands`` entry-point group.

``--once`` is the cron job: it settles every call due when it starts, prints one line
per outcome class and exits 0; it exits 1 only when the database cannot be reached.
Without ``--once`` it runs pass after pass until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher import runtime
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.cli.ops_server import process_ops
from dispatcher.cli.parsing import fail, require_registry
from dispatcher.db.engine import create_engine, session_factory
from dispatcher.db.errors import DbErrorClass, classify
from dispatcher.provider.contract import Credentials
from dispatcher.provider.transport import Transport
from dispatcher.settings import Settings
from reconciler.loop import Reconciler


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
    """The reconciler loop until ``stop`` is set: what `tool-dispatcher up` runs beside
    the API, relay and worker (entry-point group ``tool_dispatcher.services``)."""
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
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with process_ops(settings, "reconciler"):
        await run_service(settings, registry, stop)
    return 0
