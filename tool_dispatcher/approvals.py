"""`tool-dispatcher approvals expire [--once]`: the approval expiry sweeper.

Each pass tells webhook subscribers of the pending approvals about to expire
(``approval.expiring``, once each, ``webhooks.expiring_within_seconds`` ahead), then
closes every pending approval past its expiry (``approval.expired``; the call is
cancelled), a bounded batch per transaction. ``--once`` makes one pass and
exits (for cron); without it, a pass every ``--interval`` seconds until SIGTERM or
SIGINT, surviving a pass that fails (the database away: logged, counted, tried again
after a backoff). A missing database setting exits 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher import runtime
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.approvals import expire_due
from dispatcher.db.engine import create_engine, session_factory
from dispatcher.db.errors import DbErrorClass, classify
from dispatcher.settings import Settings, Topics
from dispatcher.webhooks.sweeps import report_expiring
from kit.cli import OneLineArgumentParser, fail
from kit.periodic import periodic
from kit.signals import stop_on_signals
from tool_dispatcher.ops_server import process_ops


def register(subparsers: Any) -> None:
    """Add the ``approvals`` command to the `tool-dispatcher` parser."""
    parser = subparsers.add_parser("approvals", help="human approvals of tool calls")
    sub = parser.add_subparsers(
        dest="approvals_command", required=True, parser_class=OneLineArgumentParser
    )
    expire = sub.add_parser("expire", help="close pending approvals past their expiry")
    expire.add_argument("--once", action="store_true", help="one pass, then exit")
    expire.add_argument("--interval", type=float, default=30.0, help="seconds between passes")
    expire.add_argument("--batch", type=int, default=500, help="approvals per transaction")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run one ``approvals`` subcommand."""
    if settings.database_url is None:
        fail("TOOL_DISPATCHER_DATABASE_URL is not set")
    if args.interval <= 0 or args.batch < 1:
        fail("--interval must be positive and --batch at least 1")
    try:
        return runtime.run(_run(args, settings), settings)
    except Exception as exc:
        if classify(exc) is not DbErrorClass.UNAVAILABLE:
            raise
        fail(f"cannot reach the database: {type(exc).__name__}", 1)
    except KeyboardInterrupt:
        return 0


LOOP = "approval_expiry"
"""The ``loop`` label of the sweeper's step metrics and the name in its log lines."""


async def expire_all(
    sessions: async_sessionmaker[AsyncSession],
    *,
    topics: Topics,
    batch: int = 500,
    expiring_within: float | None = None,
) -> list[str]:
    """One sweep: every approval due now, a batch per transaction; first, when
    ``expiring_within`` is given, ``approval.expiring`` for those about to expire."""
    if expiring_within is not None:
        while True:
            async with sessions() as session, session.begin():
                told = await report_expiring(session, within=expiring_within, limit=batch)
            if told < batch:
                break
    closed: list[str] = []
    while True:
        async with sessions() as session, session.begin():
            done = await expire_due(session, limit=batch, topics=topics)
        closed.extend(done)
        if len(done) < batch:
            return closed


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.once:
        engine = create_engine(settings)
        try:
            closed = await expire_all(
                session_factory(engine),
                topics=settings.topics(),
                batch=args.batch,
                expiring_within=settings.webhooks.expiring_within_seconds,
            )
        finally:
            await engine.dispose()
        print(f"expired: {len(closed)}", flush=True)
        return 0
    # The sweeper as a service: ops endpoints for its lifetime (none for the cron pass),
    # and SIGTERM or SIGINT ends it between two sweeps.
    with stop_on_signals(asyncio.Event()) as stop:
        async with process_ops(settings, "approvals"):
            await sweep_until(settings, stop, args.interval, batch=args.batch, echo=True)
    return 0


async def run_service(
    settings: Settings, registry: CapabilityRegistry, stop: asyncio.Event
) -> None:
    """The expiry sweeper until ``stop`` is set: what `python -m devtools up` runs."""
    await sweep_until(settings, stop, settings.approval_sweep_interval_seconds)


async def sweep_until(
    settings: Settings,
    stop: asyncio.Event,
    every: float,
    *,
    batch: int = 500,
    echo: bool = False,
) -> None:
    """A sweep at once, then every ``every`` seconds until ``stop`` is set. A sweep
    that raises (the database away) is logged and counted, and the loop goes on after
    a backoff (:func:`periodic`). ``echo`` prints each sweep's count (the command)."""
    engine = create_engine(settings)
    sessions = session_factory(engine)

    async def sweep() -> None:
        closed = await expire_all(
            sessions,
            topics=settings.topics(),
            batch=batch,
            expiring_within=settings.webhooks.expiring_within_seconds,
        )
        if echo:
            print(f"expired: {len(closed)}", flush=True)

    try:
        await periodic(stop, every, sweep, name=LOOP)
    finally:
        await engine.dispose()
