"""`tool-dispatcher webhooks [--once]`: the webhook sender.

Fans notifications out to the subscriptions of the settings (``webhooks.*``), signs
each delivery and POSTs it, retrying with backoff until it is delivered or dead; it
reports outbox dead letters too. Without ``--once``, a pass every
``webhooks.interval_seconds`` until SIGTERM or SIGINT, with its ops endpoints; several
may run at once (claims skip each other's rows). ``--once``: one pass, its POSTs
awaited, then exit (a test or a cron). A missing database setting exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from dispatcher import runtime
from dispatcher.db.errors import DbErrorClass, classify
from dispatcher.settings import Settings
from dispatcher.webhooks.service import run_sender
from kit.cli import fail
from kit.signals import stop_on_signals
from tool_dispatcher.ops_server import process_ops


def register(subparsers: Any) -> None:
    """Add the ``webhooks`` command to the `tool-dispatcher` parser."""
    parser = subparsers.add_parser("webhooks", help="deliver signed webhooks to subscribers")
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run the sender."""
    if settings.database_url is None:
        fail("TOOL_DISPATCHER_DATABASE_URL is not set")
    try:
        settings.webhooks.all_subscriptions()
    except (OSError, ValueError) as exc:
        fail(f"bad webhook subscriptions: {type(exc).__name__}: {exc}")
    try:
        return runtime.run(_run(args, settings), settings)
    except Exception as exc:
        if classify(exc) is not DbErrorClass.UNAVAILABLE:
            raise
        fail(f"cannot reach the database: {type(exc).__name__}", 1)
    except KeyboardInterrupt:
        return 0


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.once:
        await run_sender(settings, asyncio.Event(), once=True)
        return 0
    with stop_on_signals(asyncio.Event()) as stop:
        async with process_ops(settings, "webhooks"):
            await run_sender(settings, stop)
    return 0
