"""Retention's writes: the only code that removes history (dispatcher.retention decides
what and when; this module writes it).

- the manifest of archive batches (``retention_batches``): planned with the files it
  will write, then written, verified, and removed or abandoned;
- the removal of a batch's calls, with their approvals and escalations, only if every
  call is exactly as it was archived (its version and last change), in one transaction,
  which also takes them out of their runs' summaries;
- the days of ``execution_events``: created ahead (through the migration's
  ``execution_events_ensure_partition``), and dropped whole once archived. Rows of the
  log are never deleted: its trigger refuses that, and a dropped day is a table gone;
- the audit (``retention_log``): what each batch removed, per tenant and day.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, text, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import (
    approvals,
    escalations,
    retention_batches,
    retention_log,
    tool_calls,
)
from dispatcher.ledger.summaries import forget_calls

# A day's partition of execution_events, and nothing else, may be dropped here.
DAY_PARTITION = re.compile(r"execution_events_p(\d{8})")

# DDL on execution_events waits at most this long for its lock, then fails (the job
# tries again next pass): a queued ACCESS EXCLUSIVE lock would stall every insert of
# intake behind it.
DDL_LOCK_TIMEOUT = "5s"


@dataclass(frozen=True, slots=True)
class Member:
    """A call of a batch as it was archived: a change since makes it not removable."""

    tool_call_id: str
    version: int
    updated_at: datetime

    def as_json(self) -> list[Any]:
        return [self.tool_call_id, self.version, self.updated_at.isoformat()]

    @classmethod
    def of_json(cls, value: Sequence[Any]) -> Member:
        return cls(str(value[0]), int(value[1]), datetime.fromisoformat(str(value[2])))


@dataclass(frozen=True, slots=True)
class Removed:
    """Rows a batch's removal deleted, and the runs whose calls they were."""

    calls: int
    approvals: int
    escalations: int
    runs: frozenset[str]


async def plan_batch(
    session: AsyncSession,
    batch_id: str,
    *,
    kind: str,
    tenant: str | None,
    members: Any,
    files: list[dict[str, Any]],
) -> None:
    """Record a batch as planned, with the files it will write, before any is written:
    a file in the archive always has its batch in the manifest. A batch planned before
    (same content, same id) is left as it is, unless it was abandoned (a day found
    live once, droppable now): planned again."""
    await session.execute(
        pg_insert(retention_batches)
        .values(
            batch_id=batch_id,
            kind=kind,
            tenant=tenant,
            state="planned",
            members=members,
            files=files,
        )
        .on_conflict_do_update(
            index_elements=[retention_batches.c.batch_id],
            set_={"state": "planned", "members": members, "files": files, "updated_at": func.now()},
            where=retention_batches.c.state == "abandoned",
        )
    )


async def set_state(
    session: AsyncSession,
    batch_id: str,
    state: str,
    *,
    files: list[dict[str, Any]] | None = None,
) -> None:
    values: dict[str, Any] = {"state": state, "updated_at": func.now()}
    if files is not None:
        values["files"] = files
    if state == "removed":
        values["members"] = None  # the archive holds them now; the manifest stays small
    await session.execute(
        update(retention_batches).where(retention_batches.c.batch_id == batch_id).values(values)
    )


async def remove_calls(
    session: AsyncSession,
    tenant: str,
    members: Sequence[Member],
    *,
    midway: Callable[[], None] = lambda: None,
) -> Removed | None:
    """Delete the batch's calls, approvals and escalations if every call is still there
    exactly as archived; None, with nothing deleted, if one changed or is gone (the
    batch is then abandoned and planned again). The caller commits. ``midway`` runs
    between the approvals' and escalations' deletes and the calls' (a crash point)."""
    ids = [m.tool_call_id for m in members]
    locked = await session.execute(
        select(
            tool_calls.c.tool_call_id,
            tool_calls.c.version,
            tool_calls.c.updated_at,
            tool_calls.c.run_id,
            tool_calls.c.status,
        )
        .where(tool_calls.c.tenant == tenant, tool_calls.c.tool_call_id.in_(ids))
        .with_for_update()
    )
    found = {r.tool_call_id: r for r in locked}
    if len(found) != len(members) or any(
        (found[m.tool_call_id].version, found[m.tool_call_id].updated_at)
        != (m.version, m.updated_at)
        for m in members
    ):
        return None
    mine_a = (approvals.c.tenant == tenant, approvals.c.tool_call_id.in_(ids))
    mine_e = (escalations.c.tenant == tenant, escalations.c.tool_call_id.in_(ids))
    gone_a = (await session.execute(delete(approvals).where(*mine_a))).rowcount  # type: ignore[attr-defined]
    gone_e = (await session.execute(delete(escalations).where(*mine_e))).rowcount  # type: ignore[attr-defined]
    midway()
    gone_c = (
        await session.execute(
            delete(tool_calls).where(
                tuple_(tool_calls.c.tenant, tool_calls.c.tool_call_id).in_(
                    [(tenant, i) for i in ids]
                )
            )
        )
    ).rowcount  # type: ignore[attr-defined]
    # The runs' summaries lose the calls, last: their rows are taken after every call
    # row this transaction locks (dispatcher.ledger.summaries).
    await forget_calls(session, tenant, [(r.run_id, r.status) for r in found.values()])
    return Removed(gone_c, gone_a, gone_e, frozenset(r.run_id for r in found.values()))


async def log_removal(session: AsyncSession, rows: Iterable[Mapping[str, Any]]) -> None:
    """The audit rows of one batch: ``batch_id``, ``kind``, ``tenant``, ``day`` and its
    counts (``retention_log``)."""
    listed = [dict(r) for r in rows]
    if listed:
        await session.execute(insert(retention_log), listed)


async def ensure_partitions(session: AsyncSession, days: Iterable[date]) -> int:
    """Create the days of ``execution_events`` that do not exist yet; how many were."""
    await session.execute(text(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'"))
    made = 0
    for day in sorted(set(days)):
        created = await session.scalar(
            text("SELECT execution_events_ensure_partition(:day)").bindparams(day=day)
        )
        made += bool(created)
    return made


async def drop_partition(session: AsyncSession, name: str) -> None:
    """Drop one day of ``execution_events``, every row in it, as a whole table: the
    append-only trigger refuses deleting rows, and dropping a day is the one way
    events leave, once retention archived what belongs to no live call or run."""
    if not DAY_PARTITION.fullmatch(name):
        raise ValueError(f"not a day of execution_events: {name!r}")
    await session.execute(text(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'"))
    await session.execute(text(f'DROP TABLE "{name}"'))
