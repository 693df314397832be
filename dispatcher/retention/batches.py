"""One batch of one tenant's due calls: planned, written, verified, then removed.

1. **plan**: the batch's files are encoded in memory from the stored rows and the
   manifest records the batch (its calls with their version and last change, its files
   with their row counts and SHA-256), committed before any file is written;
2. **write** every file (its name is the batch id, derived from the batch's content);
3. **verify**: each file is read back from the store, its bytes' SHA-256 and its row
   count compared with the manifest's; the manifest says verified;
4. **remove**, in one transaction: the calls are locked and compared with the
   manifest; if every one is unchanged, their approvals, escalations and the calls are
   deleted, the manifest says removed and the audit log says what left. If one changed
   (an operator retried it, a stop marked it), nothing is deleted: the batch's files are
   removed from the archive and the batch abandoned; the calls are planned afresh.

A crash anywhere is resumed by the next pass from the manifest (:func:`settle`): a
verified batch is verified again and removed; an earlier one is rebuilt from the rows,
which are unchanged or the batch is abandoned, and written again under the same names.
Either way each call ends exactly once in the archive, or still live.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.ledger import retention as ledger
from dispatcher.ledger.retention import Member
from dispatcher.retention.archive import Archive, ArchiveUnavailable, Encoded, encode, file_path
from dispatcher.retention.eligibility import batch_rows
from dispatcher.retention.rows import TABLES, to_arrow
from kit.crashpoints import CrashPoints


@dataclass(frozen=True, slots=True)
class Context:
    """What every step of a pass works with."""

    sessions: async_sessionmaker[AsyncSession]
    archive: Archive
    crash: CrashPoints


@dataclass(frozen=True, slots=True)
class Settled:
    """What became of a batch: its calls removed (and the rows that went with them), or
    abandoned (``calls`` 0)."""

    calls: int = 0
    events: int = 0
    approvals: int = 0
    escalations: int = 0
    abandoned: bool = False


def batch_id_of(tenant: str, members: Sequence[Member]) -> str:
    """The batch's name: its tenant and calls as archived, hashed."""
    content = json.dumps([tenant, sorted(m.as_json() for m in members)])
    return hashlib.sha256(content.encode()).hexdigest()[:32]


def _day(row: Mapping[Any, Any]) -> date:
    created: Any = row["created_at"]
    return created.astimezone(UTC).date()  # type: ignore[no-any-return]


def encode_batch(
    tenant: str, batch_id: str, rows: Mapping[str, Sequence[Mapping[Any, Any]]]
) -> list[Encoded]:
    """The batch's files: per day of its calls' creation, one per table with rows."""
    day_of = {c["tool_call_id"]: _day(c) for c in rows["calls"]}
    files = []
    for day in sorted(set(day_of.values())):
        for name in TABLES:
            mine = [r for r in rows[name] if day_of.get(r["tool_call_id"]) == day]
            if mine:
                path = file_path(tenant, day, name, batch_id)
                files.append(encode(path, name, tenant, day, to_arrow(name, mine)))
    return files


async def _rebuilt(
    ctx: Context, tenant: str, batch_id: str, members: Sequence[Member]
) -> list[Encoded] | None:
    """The batch's files from the stored rows, or None if a call changed or is gone."""
    async with ctx.sessions() as session:
        rows = await batch_rows(session, tenant, [m.tool_call_id for m in members])
    stored = {(c["tool_call_id"], c["version"], c["updated_at"]) for c in rows["calls"]}
    if stored != {(m.tool_call_id, m.version, m.updated_at) for m in members}:
        return None
    return await asyncio.to_thread(encode_batch, tenant, batch_id, rows)


async def archive_calls(ctx: Context, tenant: str, members: Sequence[Member]) -> Settled:
    """Plan, write, verify and remove one batch of ``tenant``'s due calls."""
    batch_id = batch_id_of(tenant, members)
    files = await _rebuilt(ctx, tenant, batch_id, members)
    if files is None:
        return Settled(abandoned=True)  # changed since it was found due: next pass
    async with ctx.sessions.begin() as session:
        await ledger.plan_batch(
            session,
            batch_id,
            kind="calls",
            tenant=tenant,
            members=[m.as_json() for m in members],
            files=[f.entry() for f in files],
        )
    ctx.crash.hit("after-plan")
    return await _write_verify_remove(ctx, batch_id, tenant, members, files)


async def settle(ctx: Context, batch: Mapping[Any, Any]) -> Settled:
    """Finish a calls batch an earlier pass left unfinished (a manifest row)."""
    batch_id, tenant = str(batch["batch_id"]), str(batch["tenant"])
    members = [Member.of_json(m) for m in batch["members"]]
    entries: list[dict[str, Any]] = list(batch["files"])
    if batch["state"] == "verified" and await _all_verified(ctx.archive, entries):
        return await _remove(ctx, batch_id, tenant, members, entries)
    files = await _rebuilt(ctx, tenant, batch_id, members)
    if files is None:
        await abandon(ctx, batch_id, entries)
        return Settled(abandoned=True)
    return await _write_verify_remove(ctx, batch_id, tenant, members, files)


async def write_and_verify(ctx: Context, batch_id: str, files: Sequence[Encoded]) -> None:
    """Steps 2 and 3, for a batch of either kind: each file written whole, read back
    and checked; the manifest moves to written, then verified."""
    for file in files:
        await asyncio.to_thread(ctx.archive.put, file)
    ctx.crash.hit("after-write")
    entries = [f.entry() for f in files]
    async with ctx.sessions.begin() as session:
        await ledger.set_state(session, batch_id, "written", files=entries)
    if not await _all_verified(ctx.archive, entries):
        # Just written and not read back the same: the store is not keeping what it is
        # given. Nothing is removed; the next pass writes the batch again.
        raise ArchiveUnavailable(f"batch {batch_id}: a file read back differs from its write")
    async with ctx.sessions.begin() as session:
        await ledger.set_state(session, batch_id, "verified")
    ctx.crash.hit("after-verify")


async def _write_verify_remove(
    ctx: Context, batch_id: str, tenant: str, members: Sequence[Member], files: list[Encoded]
) -> Settled:
    await write_and_verify(ctx, batch_id, files)
    return await _remove(ctx, batch_id, tenant, members, [f.entry() for f in files])


async def _all_verified(archive: Archive, entries: Sequence[Mapping[str, Any]]) -> bool:
    for entry in entries:
        if not await asyncio.to_thread(archive.verify, entry):
            return False
    return True


def _counts(entries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Rows archived per day and table, from the manifest's entries."""
    by_day: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(TABLES, 0))
    for entry in entries:
        by_day[str(entry["day"])][str(entry["table"])] += int(entry["rows"])
    return by_day


async def _remove(
    ctx: Context,
    batch_id: str,
    tenant: str,
    members: Sequence[Member],
    entries: Sequence[Mapping[str, Any]],
) -> Settled:
    midway: Callable[[], None] = lambda: ctx.crash.hit("mid-delete")  # noqa: E731
    async with ctx.sessions.begin() as session:
        removed = await ledger.remove_calls(session, tenant, members, midway=midway)
        if removed is not None:
            await ledger.set_state(session, batch_id, "removed")
            await ledger.log_removal(
                session,
                [
                    {
                        "batch_id": batch_id,
                        "kind": "calls",
                        "tenant": tenant,
                        "day": date.fromisoformat(day),
                        "calls": n["calls"],
                        "approvals": n["approvals"],
                        "escalations": n["escalations"],
                        "events_archived": n["events"],
                    }
                    for day, n in sorted(_counts(entries).items())
                ],
            )
    if removed is None:
        await abandon(ctx, batch_id, entries)
        return Settled(abandoned=True)
    events = sum(int(e["rows"]) for e in entries if e["table"] == "events")
    return Settled(removed.calls, events, removed.approvals, removed.escalations)


async def abandon(ctx: Context, batch_id: str, entries: Sequence[Mapping[str, Any]]) -> None:
    """Take a batch's files out of the archive (its calls stay live), then say so."""
    for entry in entries:
        await asyncio.to_thread(ctx.archive.remove, str(entry["path"]))
    async with ctx.sessions.begin() as session:
        await ledger.set_state(session, batch_id, "abandoned")
