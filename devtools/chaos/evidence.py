"""What the invariants of a chaos run are checked against, collected from the run's
database, the sandbox's books, the load and the dead letters the harness handled."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

import httpx
from sqlalchemy import Text, cast, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from devtools.chaos import retention
from devtools.chaos.checker import CallId, CallRecord, Evidence
from devtools.chaos.dead_letters import DeadLetterDesk
from devtools.chaos.retention import Archived
from devtools.chaos.stats import LoadStats
from dispatcher.db.tables import escalations, execution_events, outbox, tool_calls
from dispatcher.ledger.messages import Producer
from dispatcher.schemas import EventView
from dispatcher.states import SETTLED_STATES
from dispatcher.states import ExecutionStatus as S
from dispatcher.states import VerificationStatus as V
from dispatcher.tenancy import stored_provider_key

_UNPUBLISHED = (outbox.c.published_at.is_(None), outbox.c.dead_lettered_at.is_(None))


async def unsettled_count(engine: AsyncEngine) -> tuple[int, int]:
    """Calls not yet settled, and outbox rows not yet published (settling progress)."""
    async with engine.connect() as conn:
        calls = (
            await conn.execute(
                select(func.count())
                .select_from(tool_calls)
                .where(tool_calls.c.status.not_in([s.value for s in SETTLED_STATES]))
            )
        ).scalar_one()
        rows = (
            await conn.execute(select(func.count()).select_from(outbox).where(*_UNPUBLISHED))
        ).scalar_one()
    return int(calls), int(rows)


def _record(r: Mapping[Any, Any], read_only: Collection[str]) -> CallRecord:
    return CallRecord(
        r["tool_call_id"],
        r["tenant"],
        r["run_id"],
        S(r["status"]),
        V(r["verification_status"]),
        # The key every send, lookup and compensation used: as the sandbox got it.
        stored_provider_key(r["tenant"], r["idempotency_key"], r["provider_key"]),
        r["capability_id"] not in read_only,
        r["idempotency_key"],
        r["input"],
        r["result"],
        r["external_request_id"],
    )


async def _calls(conn: AsyncConnection, read_only: Collection[str]) -> dict[CallId, CallRecord]:
    return {
        (r.tenant, r.tool_call_id): _record(r._mapping, read_only)
        for r in await conn.execute(select(tool_calls))
    }


Sequenced = list[tuple[int, str, EventView]]
"""Events with their place in the log (``seq``) and their tenant."""


def _with_archive(
    evidence: Evidence, events: Sequenced, found: Archived, read_only: Collection[str]
) -> None:
    """The run's calls are the live ones and the archived ones: each archived call, its
    events and its escalations join the evidence, and invariant 9 gets what the archive
    shows retention did wrong. (An archived call's events stay in the live log until
    their day's partition is dropped: each event is taken once.)"""
    live = evidence.calls
    evidence.retention_breaches = retention.breaches(found, live.keys(), evidence.events)
    evidence.archived_calls = len(found.copies())
    calls = {(r["tenant"], r["tool_call_id"]): _record(r, read_only) for r in found.calls}
    evidence.calls = {**calls, **live}
    seen = {e.event_id for _, _, e in events}
    events = events + [
        (r["seq"], r["tenant"], EventView.of(r)) for r in found.events if r["event_id"] not in seen
    ]
    evidence.events = [(t, e) for _, t, e in sorted(events, key=lambda x: x[0])]
    reasons = Counter(evidence.escalation_reasons)
    reasons.update(r["reason"] for r in found.escalations)
    evidence.escalation_reasons = dict(reasons)


async def gather(
    engine: AsyncEngine,
    sandbox_url: str,
    stats: LoadStats,
    desk: DeadLetterDesk,
    *,
    read_only: Collection[str],
    dispatch_topic: str,
    max_message_bytes: int,
    archive: Archived | None = None,
) -> Evidence:
    """The evidence; with ``archive``, what retention archived joins it."""
    async with engine.connect() as conn:
        calls = await _calls(conn, read_only)
        events: Sequenced = [
            (r.seq, r.tenant, EventView.of(r._mapping))
            for r in await conn.execute(select(execution_events).order_by(execution_events.c.seq))
        ]
        unpublished = (
            await conn.execute(select(func.count()).select_from(outbox).where(*_UNPUBLISHED))
        ).scalar_one()
        largest = (
            await conn.execute(
                select(func.max(func.octet_length(cast(outbox.c.payload, Text)))).where(
                    outbox.c.published_at.is_not(None)
                )
            )
        ).scalar_one()
        taken_over = (
            await conn.execute(
                select(func.count(func.distinct(execution_events.c.tool_call_id))).where(
                    execution_events.c.producer == Producer.RECOVERY
                )
            )
        ).scalar_one()
        reasons = {
            r.reason: int(r.n)
            for r in await conn.execute(
                select(escalations.c.reason, func.count().label("n")).group_by(escalations.c.reason)
            )
        }
        commands = (
            await conn.execute(
                select(func.count()).select_from(outbox).where(outbox.c.topic == dispatch_topic)
            )
        ).scalar_one()
    async with httpx.AsyncClient(base_url=sandbox_url, timeout=10.0) as client:
        response = await client.get("/v1/effects")
        response.raise_for_status()
        books = response.json()
    evidence = Evidence(
        acknowledged=[(a.tenant, a.tool_call_id) for a in stats.acks],
        replay_mismatches=[
            f"{m.original} answered {m.http_status} {m.answered}" for m in stats.replay_mismatches
        ],
        calls=calls,
        events=[(t, e) for _, t, e in events],
        effects=books["effects"],
        reversals=books["reversals"],
        unpublished=int(unpublished),
        dead_letters=sorted(desk.seen.values(), key=lambda d: d.id),
        oversized=set(stats.oversized),
        max_message_bytes=max_message_bytes,
        listed=desk.listed,
        discarded=desk.discarded,
        foreign_refusals=stats.foreign_refusals,
        commands_reemitted=int(commands) - len(calls),
        taken_over=int(taken_over),
        escalation_reasons=reasons,
        hostile_misanswered=stats.hostile_misanswered,
        valid_refused=stats.valid_refused,
        largest_published=int(largest or 0),
    )
    if archive is not None:
        _with_archive(evidence, events, archive, read_only)
    return evidence
