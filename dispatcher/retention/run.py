"""One retention pass: what `tool-dispatcher retention --once` runs.

1. reach the archive; take the pass's lock (a second pass at the same time does
   nothing);
2. create the days of the event log ahead (and move any stranded in the default
   partition into theirs);
3. finish every batch a crashed pass left in the manifest;
4. archive each tenant's due calls, a batch per tenant in turn (no tenant's backlog
   holds up the others), until none is due or the time budget is spent;
5. archive and drop each past day of the event log that holds nothing live;
6. count what is still due (the gauge an alert watches).

Each batch commits on its own, so a pass stopped anywhere keeps what it finished.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.db.engine import session_factory
from dispatcher.db.tables import UNFINISHED_BATCH_STATES, retention_batches
from dispatcher.retention import batches, partitions
from dispatcher.retention.archive import Archive
from dispatcher.retention.batches import Context, Settled
from dispatcher.retention.eligibility import due_batch, due_count, tenants
from dispatcher.retention.metrics import ARCHIVED_CALLS, DROPPED_PARTITIONS, DUE_CALLS
from dispatcher.retention.policy import RetentionPolicy
from kit.crashpoints import CrashPoints

# One pass at a time, database-wide (a session lock: a crashed pass's goes with its
# connection).
_LOCK = "hashtext('tool-dispatcher-retention')"


@dataclass
class PassReport:
    """What one pass did."""

    calls: int = 0
    events: int = 0
    approvals: int = 0
    escalations: int = 0
    batches: int = 0
    abandoned: int = 0
    resumed: int = 0
    days_dropped: int = 0
    events_dropped: int = 0
    days_created: int = 0
    due: int = 0
    out_of_time: bool = False
    skipped: bool = False

    def add(self, settled: Settled) -> None:
        self.calls += settled.calls
        self.events += settled.events
        self.approvals += settled.approvals
        self.escalations += settled.escalations
        self.batches += not settled.abandoned
        self.abandoned += settled.abandoned
        ARCHIVED_CALLS.inc(settled.calls)

    def line(self) -> str:
        """The pass in one line."""
        if self.skipped:
            return "retention: another pass is running; nothing done"
        budget = " (time budget spent)" if self.out_of_time else ""
        return (
            f"retention: archived {self.calls} calls ({self.events} events, "
            f"{self.approvals} approvals, {self.escalations} escalations) in {self.batches} "
            f"batches, {self.abandoned} abandoned, {self.resumed} resumed; dropped "
            f"{self.days_dropped} days ({self.events_dropped} events); {self.due} calls "
            f"still due{budget}"
        )


Progress = Callable[[int, int], None]
"""Told (calls archived so far, calls due when the pass began) after each batch."""


@asynccontextmanager
async def _alone(engine: AsyncEngine) -> AsyncIterator[bool]:
    async with engine.connect() as conn:
        ours = bool(await conn.scalar(text(f"SELECT pg_try_advisory_lock({_LOCK})")))
        await conn.commit()
        try:
            yield ours
        finally:
            if ours:
                await conn.execute(text(f"SELECT pg_advisory_unlock({_LOCK})"))
                await conn.commit()


async def run_pass(
    engine: AsyncEngine,
    archive: Archive,
    policy: RetentionPolicy,
    *,
    crash: CrashPoints,
    budget_seconds: float,
    ahead_days: int,
    progress: Progress | None = None,
    now: datetime | None = None,
) -> PassReport:
    """One pass (above). ``now`` is the database's clock unless given (tests age the
    history by moving it)."""
    await asyncio.to_thread(archive.check)
    ctx = Context(session_factory(engine), archive, crash)
    deadline = time.monotonic() + budget_seconds
    report = PassReport()
    async with _alone(engine) as ours:
        if not ours:
            report.skipped = True
            return report
        if now is None:
            async with ctx.sessions() as session:
                now = (await session.execute(text("SELECT now()"))).scalar_one()
        report.days_created = await partitions.ensure_days(ctx, now, ahead_days)
        await _resume(ctx, report)
        await _archive_due(ctx, policy, now, deadline, report, progress)
        if not report.out_of_time:
            await _drop_days(ctx, policy, now, deadline, report)
        report.due = await _due(ctx, policy, now)
    DUE_CALLS.set(report.due)
    return report


async def _resume(ctx: Context, report: PassReport) -> None:
    async with ctx.sessions() as session:
        rows = await session.execute(
            select(retention_batches)
            .where(retention_batches.c.state.in_(UNFINISHED_BATCH_STATES))
            .order_by(retention_batches.c.created_at)
        )
        unfinished = [r._mapping for r in rows]
    for batch in unfinished:
        report.resumed += 1
        if batch["kind"] == "calls":
            report.add(await batches.settle(ctx, batch))
        else:
            _dropped(report, await partitions.settle(ctx, batch))


async def _due(ctx: Context, policy: RetentionPolicy, now: datetime) -> int:
    async with ctx.sessions() as session:
        return sum([await due_count(session, policy, t, now) for t in await tenants(session)])


async def _archive_due(
    ctx: Context,
    policy: RetentionPolicy,
    now: datetime,
    deadline: float,
    report: PassReport,
    progress: Progress | None,
) -> None:
    total = await _due(ctx, policy, now) if progress else 0
    async with ctx.sessions() as session:
        waiting = await tenants(session)
    while waiting:
        for tenant in list(waiting):
            if time.monotonic() > deadline:
                report.out_of_time = True
                return
            async with ctx.sessions() as session:
                members = await due_batch(session, policy, tenant, now)
            if not members:
                waiting.remove(tenant)
                continue
            report.add(await batches.archive_calls(ctx, tenant, members))
            if progress:
                progress(report.calls, max(total, report.calls))


def _dropped(report: PassReport, rows: int | None) -> None:
    if rows is not None:
        report.days_dropped += 1
        report.events_dropped += rows
        DROPPED_PARTITIONS.inc()


async def _drop_days(
    ctx: Context, policy: RetentionPolicy, now: datetime, deadline: float, report: PassReport
) -> None:
    # A day younger than the shortest retention holds calls no tenant has let go yet.
    # Yesterday and today always stay: ensure_days keeps them (an event written near
    # midnight), and a retention under a day would drop and create yesterday each pass.
    newest = min((now - timedelta(days=policy.shortest_days())).date(), now.date() - timedelta(1))
    async with ctx.sessions() as session:
        found = await partitions.days(session)
    for day, name in sorted(found.items()):
        if day >= newest:
            break
        if time.monotonic() > deadline:
            report.out_of_time = True
            return
        _dropped(report, await partitions.archive_day(ctx, day, name))
