"""The days of the event log: created ahead, and dropped whole once nothing live is in
them. Rows of ``execution_events`` are never deleted (its trigger refuses); a day
leaves as a table.

A day is droppable when none of its events belongs to a call still in ``tool_calls``
and none of its run-level events (no call: ``run.stopped``) belongs to a run that still
has a call there. The events of removed calls were archived with them
(:mod:`dispatcher.retention.batches`); the run-level events are archived here, per
tenant, before the day is dropped, through the same manifest, write and verify steps.
Only days older than the shortest retention are looked at, one check each per pass.

Nothing can become live again in such a day: an event is written with its call (or
after it), a removed call never comes back, and a run with a ``run.stopped`` event
takes no new call. So the check is made once, before the day is archived.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.ledger import retention as ledger
from dispatcher.retention.archive import encode, file_path
from dispatcher.retention.batches import Context, abandon, write_and_verify
from dispatcher.retention.rows import to_arrow

_DAYS = text(
    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
    " WHERE i.inhparent = 'execution_events'::regclass"
)
_STRANDED = text(
    "SELECT DISTINCT (occurred_at AT TIME ZONE 'UTC')::date FROM execution_events_default"
)


def day_name(day: date) -> str:
    return f"execution_events_p{day:%Y%m%d}"


async def ensure_days(ctx: Context, now: datetime, ahead_days: int) -> int:
    """Create yesterday, today and ``ahead_days`` days ahead, and any day whose events
    landed in the default partition (moved into their day); how many were created."""
    today = now.date()
    wanted = {today + timedelta(days=n) for n in range(-1, ahead_days + 1)}
    async with ctx.sessions.begin() as session:
        wanted |= set((await session.execute(_STRANDED)).scalars())
        return await ledger.ensure_partitions(session, wanted)


async def days(session: AsyncSession) -> dict[date, str]:
    """Each day of the log that has a partition, with the partition's name."""
    found = {}
    for name in (await session.execute(_DAYS)).scalars():
        match = ledger.DAY_PARTITION.fullmatch(name)
        if match:
            found[datetime.strptime(match.group(1), "%Y%m%d").date()] = name  # noqa: DTZ007
    return found


async def droppable(session: AsyncSession, name: str) -> bool:
    """Whether no event of the day ``name`` belongs to a live call or run."""
    table = ledger.DAY_PARTITION.fullmatch(name) and f'"{name}"'
    if not table:
        raise ValueError(f"not a day of execution_events: {name!r}")
    query = text(
        f"""SELECT NOT EXISTS (
            SELECT 1 FROM {table} e JOIN tool_calls c
            ON c.tenant = e.tenant AND c.tool_call_id = e.tool_call_id
        ) AND NOT EXISTS (
            SELECT 1 FROM {table} e WHERE e.tool_call_id IS NULL AND EXISTS (
                SELECT 1 FROM tool_calls c WHERE c.tenant = e.tenant AND c.run_id = e.run_id)
        )"""  # noqa: S608 - the name is checked above
    )
    return bool((await session.execute(query)).scalar_one())


def batch_id_of(day: date) -> str:
    return f"day-{day:%Y%m%d}"


async def _day_rows(session: AsyncSession, name: str) -> tuple[list[Any], dict[str, int]]:
    """The day's run-level events in log order, and its events per tenant."""
    run_level = await session.execute(
        text(f'SELECT * FROM "{name}" WHERE tool_call_id IS NULL ORDER BY seq')  # noqa: S608
    )
    counts = await session.execute(
        text(f'SELECT tenant, count(*) FROM "{name}" GROUP BY tenant')  # noqa: S608
    )
    return [r._mapping for r in run_level], {t: int(n) for t, n in counts}


async def archive_day(ctx: Context, day: date, name: str) -> int | None:
    """Archive the day's run-level events and drop it: the rows it held, or None when
    the day still holds something live (nothing is written then)."""
    batch_id = batch_id_of(day)
    async with ctx.sessions() as session:
        if not await droppable(session, name):
            return None
        rows, counts = await _day_rows(session, name)
    by_tenant: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_tenant[row["tenant"]].append(row)
    files = [
        await asyncio.to_thread(
            encode,
            file_path(tenant, day, "events", batch_id),
            "events",
            tenant,
            day,
            to_arrow("events", mine),
        )
        for tenant, mine in sorted(by_tenant.items())
    ]
    async with ctx.sessions.begin() as session:
        await ledger.plan_batch(
            session,
            batch_id,
            kind="partition",
            tenant=None,
            members={"partition": name, "events": counts},
            files=[f.entry() for f in files],
        )
    ctx.crash.hit("after-plan")
    await write_and_verify(ctx, batch_id, files)
    archived = {f.tenant: f.rows for f in files}
    async with ctx.sessions.begin() as session:
        await ledger.drop_partition(session, name)
        await ledger.set_state(session, batch_id, "removed")
        await ledger.log_removal(
            session,
            [
                {
                    "batch_id": batch_id,
                    "kind": "partition",
                    "tenant": tenant,
                    "day": day,
                    "events_archived": archived.get(tenant, 0),
                    "events_dropped": n,
                }
                for tenant, n in sorted(counts.items())
            ],
        )
    return sum(counts.values())


async def settle(ctx: Context, batch: Mapping[Any, Any]) -> int | None:
    """Finish a day an earlier pass left unfinished: its events are as they were (the
    log is append-only and the day is past), so it is archived again under the same
    names and dropped; a day already gone only closes its batch."""
    name = str(batch["members"]["partition"])
    day = datetime.strptime(name.rsplit("_p", 1)[1], "%Y%m%d").date()  # noqa: DTZ007
    async with ctx.sessions() as session:
        present = name in (await days(session)).values()
    if not present:
        # Gone without its batch closing (dropped by hand): its files may be the only
        # copy of its run-level events, so they stay.
        await abandon(ctx, str(batch["batch_id"]), [])
        return None
    dropped = await archive_day(ctx, day, name)
    if dropped is None:
        await abandon(ctx, str(batch["batch_id"]), list(batch["files"]))
    return dropped
