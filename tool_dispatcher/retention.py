"""`tool-dispatcher retention --once`: one retention pass (the CronJob).

Archives and removes what is due, a batch at a time, until nothing is due or the time
budget (``retention_budget_seconds``, or ``--budget-seconds``) is spent; prints one
summary line, with a progress bar on a terminal. Exits 0 when the pass ended, 1 when
the database or the archive cannot be reached (what the pass finished stays done), 2
with one line on a bad setting. The retention code itself (pyarrow, fsspec) is loaded
only by this command.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from dispatcher import runtime
from dispatcher.db.engine import create_engine
from dispatcher.db.errors import DbErrorClass, classify
from dispatcher.settings import Settings
from kit.cli import fail
from tool_dispatcher.parsing import require_registry

if TYPE_CHECKING:
    from dispatcher.retention.run import PassReport, Progress

log = logging.getLogger("tool_dispatcher.retention")


def register(subparsers: Any) -> None:
    """Add the ``retention`` command to the `tool-dispatcher` parser."""
    parser = subparsers.add_parser(
        "retention", help="archive old finished calls, verify the archive, then remove them"
    )
    parser.add_argument("--once", action="store_true", required=True, help="one pass, then exit")
    parser.add_argument("--budget-seconds", type=float, help="stop between batches after this long")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """One pass; the exit code as the module says."""
    from dispatcher.retention.archive import Archive, ArchiveUnavailable
    from dispatcher.retention.crashpoints import crash_points
    from dispatcher.retention.policy import RetentionPolicy

    if settings.database_url is None:
        fail("TOOL_DISPATCHER_DATABASE_URL is not set", 2)
    registry = require_registry(settings)
    try:
        archive = Archive(settings.archive_location(), settings.archive_storage_options)
        crash = crash_points(settings.crash_at)
    except ValueError as exc:
        fail(f"bad retention setting: {exc}", 2)
    budget = args.budget_seconds or settings.retention_budget_seconds
    policy = RetentionPolicy.of(settings, registry)
    try:
        with _progress() as progress:
            report = runtime.run(
                _pass(settings, archive, policy, crash, budget, progress), settings
            )
    except ArchiveUnavailable as exc:
        _push(settings, succeeded=False)
        fail(f"cannot reach the archive: {exc}", 1)
    except Exception as exc:
        if classify(exc) is not DbErrorClass.UNAVAILABLE:
            raise
        _push(settings, succeeded=False)
        fail(f"cannot reach the database: {type(exc).__name__}", 1)
    print(report.line())
    _push(settings, succeeded=True)
    return 0


async def _pass(
    settings: Settings, archive: Any, policy: Any, crash: Any, budget: float, progress: Any
) -> PassReport:
    from dispatcher.retention.run import run_pass

    engine = create_engine(settings)
    try:
        return await run_pass(
            engine,
            archive,
            policy,
            crash=crash,
            budget_seconds=budget,
            ahead_days=settings.retention_partitions_ahead_days,
            progress=progress,
        )
    finally:
        await engine.dispose()


@contextmanager
def _progress() -> Iterator[Progress | None]:
    """A progress bar of the calls archived, on stderr when it is a terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress(
        "archiving calls",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("calls", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield advance


def _push(settings: Settings, *, succeeded: bool) -> None:
    """Push the pass's metrics when a Pushgateway is set; a gateway that cannot be
    reached is logged, never the pass's failure."""
    if settings.retention_pushgateway_url is None:
        return
    from dispatcher.retention.metrics import LAST_SUCCESS, push

    if succeeded:
        LAST_SUCCESS.set_to_current_time()
    try:
        push(settings.retention_pushgateway_url, succeeded=succeeded)
    except OSError as exc:
        log.warning("could not push the retention metrics: %s", exc)
