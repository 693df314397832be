"""The seven invariants a chaos run must end with, checked against what the database
recorded and what the provider (the sandbox) actually did.

:func:`check` is pure (evidence in, violations out); :func:`gather` collects the
evidence from the run's database and the sandbox.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.db.tables import escalations, execution_events, outbox, tool_calls
from dispatcher.ledger.messages import Producer
from dispatcher.schemas import EventView
from dispatcher.states import SETTLED_STATES
from dispatcher.states import ExecutionStatus as S
from dispatcher.states import VerificationStatus as V
from dispatcher.views.run_view import fold_run

INVARIANTS: dict[int, str] = {
    1: "every acknowledged submission exists, with its events",
    2: "every call is terminal or escalated",
    3: "the provider applied at most one effect per key, as each call's status says",
    4: "replaying the event log reproduces each call's status",
    5: "no outbox row left unpublished, no dead letter unexplained",
    6: "every hostile submission refused with a 4xx, no valid one refused as invalid",
    7: "every move out of a claim was made by the claim's holder at its version",
}

_NO_EFFECT = {S.FAILED, S.REJECTED, S.CANCELLED}


@dataclass(frozen=True, slots=True)
class CallRecord:
    tool_call_id: str
    tenant: str
    run_id: str
    status: S
    verification: V
    idempotency_key: str
    side_effects: bool = True
    """A read-only call's request changes nothing: only deduplication is checked."""


@dataclass
class Evidence:
    """Everything the invariants are checked against."""

    acknowledged: Sequence[str]
    """Tool-call ids the API answered with a 2xx."""
    replay_mismatches: Sequence[str]
    """Replays answered with anything but the original call (described)."""
    calls: Mapping[str, CallRecord]
    events: Sequence[tuple[str, EventView]]
    """The whole event log, in order, each event with its tenant."""
    effects: Mapping[str, int]
    reversals: Mapping[str, int]
    unpublished: int = 0
    dead_letters: Sequence[str] = field(default_factory=list)
    commands_reemitted: int = 0
    taken_over: int = 0
    """Calls the recovery sweep took from a worker lost between claim and outcome."""
    escalation_reasons: Mapping[str, int] = field(default_factory=dict)
    """Dispatch commands beyond each call's first (re-drives, read-only re-dispatches)."""
    hostile_misanswered: Sequence[str] = ()
    """Hostile submissions (the load's hostile_input share) answered other than 4xx."""
    valid_refused: Sequence[str] = ()
    """Valid submissions refused with a 4xx other than the load's own run stops."""


def unsettled(calls: Iterable[CallRecord]) -> list[CallRecord]:
    return [c for c in calls if c.status not in SETTLED_STATES]


def check(evidence: Evidence) -> dict[int, list[str]]:
    """Violations by invariant number (every invariant present, empty when it holds)."""
    violations: dict[int, list[str]] = {n: [] for n in INVARIANTS}
    calls = evidence.calls
    with_events = {e.tool_call_id for _, e in evidence.events}
    for call_id in evidence.acknowledged:
        if call_id not in calls:
            violations[1].append(f"{call_id}: acknowledged, not in the database")
        elif call_id not in with_events:
            violations[1].append(f"{call_id}: acknowledged, no events")
    violations[1] += [f"replay: {m}" for m in evidence.replay_mismatches]

    violations[2] = [
        f"{c.tool_call_id}: stuck in {c.status.value}" for c in unsettled(calls.values())
    ]

    keys = {c.idempotency_key for c in calls.values()}
    for call in calls.values():
        violations[3] += _effects(
            call,
            evidence.effects.get(call.idempotency_key, 0),
            evidence.reversals.get(call.idempotency_key, 0),
        )
    for key, applied in sorted(evidence.effects.items()):
        if key not in keys and applied:
            violations[3].append(f"key {key}: {applied} effect(s) that no call accounts for")

    violations[4] = _replayed(evidence.events, calls)

    if evidence.unpublished:
        violations[5].append(f"{evidence.unpublished} outbox row(s) never published")
    violations[5] += [f"dead letter: {d}" for d in evidence.dead_letters]
    violations[6] = [f"hostile: {h}" for h in evidence.hostile_misanswered]
    violations[6] += [f"valid refused: {v}" for v in evidence.valid_refused]
    violations[7] = unfenced(evidence.events)
    return violations


def _effects(call: CallRecord, applied: int, reversed_: int) -> list[str]:
    who = f"{call.tool_call_id} ({call.status.value}, key {call.idempotency_key})"
    if applied > 1:
        return [f"{who}: applied {applied} times"]
    if not call.side_effects:
        return []
    success = call.status is S.COMPLETED or (
        call.status is S.CONFIRMED and call.verification is V.CONFIRMED_SUCCESS
    )
    failure = call.status in _NO_EFFECT or (
        call.status is S.CONFIRMED and call.verification is V.CONFIRMED_FAILURE
    )
    if success and applied != 1:
        return [f"{who}: settled as success, {applied} effects"]
    if failure and applied != 0:
        return [f"{who}: settled as failure, {applied} effect(s)"]
    if call.status is S.COMPENSATED and (applied != 1 or reversed_ != 1):
        return [f"{who}: compensated, {applied} effect(s), {reversed_} reversal(s)"]
    if reversed_ and call.status not in (S.COMPENSATED, S.ESCALATED):
        return [f"{who}: reversed {reversed_} time(s) but not compensated"]
    return []


def unfenced(events: Iterable[tuple[str, EventView]]) -> list[str]:
    """Moves out of ``dispatching`` that did not end the claim that held the call.

    A claim (a ``dispatching`` event) names its holder (``worker``) and the version it
    left (``claimVersion``); the move that ends it (an outcome, or the recovery sweep's
    takeover) must name the same, because it is fenced by both. One that names an
    older claim is a stale write: a worker that lost its lease recorded over another
    worker's claim of the same call.
    """
    held: dict[tuple[str, str], tuple[object, object] | None] = {}
    found = []
    for tenant, event in events:
        if event.tool_call_id is None:
            continue
        call, payload = (tenant, event.tool_call_id), event.payload
        if payload.get("to") == S.DISPATCHING.value:
            held[call] = (payload.get("worker"), payload.get("claimVersion"))
            continue
        if S.DISPATCHING.value not in payload.get("from", ()):
            continue
        by = payload.get("deadWorker" if event.producer == Producer.RECOVERY else "worker")
        ended, claim = (by, payload.get("claimVersion")), held.pop(call, None)
        if ended != claim:
            shown = f"{claim[0]} at version {claim[1]}" if claim else "no claim"
            found.append(
                f"{event.tool_call_id}: {event.event_type} by {ended[0]} for its claim at"
                f" version {ended[1]}, while the call was held by {shown}"
            )
    return found


def _replayed(
    events: Sequence[tuple[str, EventView]], calls: Mapping[str, CallRecord]
) -> list[str]:
    by_run: dict[tuple[str, str], list[EventView]] = defaultdict(list)
    for tenant, event in events:
        by_run[(tenant, event.run_id)].append(event)
    folded: dict[str, S] = {}
    for (_, run_id), run_events in by_run.items():
        for view in fold_run(run_id, run_events).tool_calls:
            folded[view.tool_call_id] = view.status
    found = []
    for call in calls.values():
        replayed = folded.get(call.tool_call_id)
        if replayed is not call.status:
            shown = replayed.value if replayed else "nothing"
            found.append(f"{call.tool_call_id}: status {call.status.value}, log says {shown}")
    return found


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
            await conn.execute(
                select(func.count())
                .select_from(outbox)
                .where(outbox.c.published_at.is_(None), outbox.c.dead_lettered_at.is_(None))
            )
        ).scalar_one()
    return int(calls), int(rows)


async def gather(
    engine: AsyncEngine,
    sandbox_url: str,
    acknowledged: Sequence[str],
    replay_mismatches: Sequence[str],
    *,
    read_only: Collection[str],
    dispatch_topic: str,
    hostile_misanswered: Sequence[str] = (),
    valid_refused: Sequence[str] = (),
) -> Evidence:
    async with engine.connect() as conn:
        calls = {
            r.tool_call_id: CallRecord(
                r.tool_call_id,
                r.tenant,
                r.run_id,
                S(r.status),
                V(r.verification_status),
                r.idempotency_key,
                r.capability_id not in read_only,
            )
            for r in await conn.execute(select(tool_calls))
        }
        events = [
            (r.tenant, EventView.of(r._mapping))
            for r in await conn.execute(select(execution_events).order_by(execution_events.c.seq))
        ]
        unpublished = (
            await conn.execute(
                select(func.count())
                .select_from(outbox)
                .where(outbox.c.published_at.is_(None), outbox.c.dead_lettered_at.is_(None))
            )
        ).scalar_one()
        dead = [
            f"row {r.id} key {r.key}: {r.last_error}"
            for r in await conn.execute(
                select(outbox.c.id, outbox.c.key, outbox.c.last_error).where(
                    outbox.c.dead_lettered_at.is_not(None)
                )
            )
        ]
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
    return Evidence(
        acknowledged=acknowledged,
        replay_mismatches=replay_mismatches,
        calls=calls,
        events=events,
        effects=books["effects"],
        reversals=books["reversals"],
        unpublished=int(unpublished),
        dead_letters=dead,
        commands_reemitted=int(commands) - len(calls),
        taken_over=int(taken_over),
        escalation_reasons=reasons,
        hostile_misanswered=hostile_misanswered,
        valid_refused=valid_refused,
    )
