"""`tool-dispatcher runs recount [--tenant T]`: count every run's calls again into its
summary (``run_summaries``), from the calls themselves.

Needed once after a rollout that crossed migration 0013: a process of the previous
release moves calls without counting them. Exact while the service runs
(:func:`dispatcher.ledger.summaries.recount`), but every move waits while it counts.
A missing database setting exits 2; an unreachable database 1.
"""

from __future__ import annotations

import argparse
from typing import Any

from dispatcher import runtime
from dispatcher.db.engine import create_engine, session_factory
from dispatcher.db.errors import DbErrorClass, classify
from dispatcher.ledger import summaries
from dispatcher.settings import Settings
from kit.cli import OneLineArgumentParser, fail


def register(subparsers: Any) -> None:
    """Add the ``runs`` command to the `tool-dispatcher` parser."""
    parser = subparsers.add_parser("runs", help="the runs' summaries")
    sub = parser.add_subparsers(
        dest="runs_command", required=True, parser_class=OneLineArgumentParser
    )
    recount = sub.add_parser(
        "recount",
        help="count every run's calls again into its summary",
        description="Count every run's calls again (of one tenant, or all) and write the "
        "counts over the runs' summaries. Moves wait while it counts (a few seconds per "
        "million calls).",
    )
    recount.add_argument("--tenant", help="only this tenant's runs")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run one ``runs`` subcommand."""
    if settings.database_url is None:
        fail("TOOL_DISPATCHER_DATABASE_URL is not set")
    try:
        return runtime.run(_recount(settings, args.tenant), settings)
    except Exception as exc:
        if classify(exc) is not DbErrorClass.UNAVAILABLE:
            raise
        fail(f"cannot reach the database: {type(exc).__name__}", 1)


async def _recount(settings: Settings, tenant: str | None) -> int:
    engine = create_engine(settings)
    try:
        async with session_factory(engine)() as session, session.begin():
            written = await summaries.recount(session, tenant)
    finally:
        await engine.dispose()
    print(f"recounted {written} runs")
    return 0
