"""Crash recovery: the three-way rule, as code.

A worker that dies between point A (claim committed) and point B (outcome committed)
leaves its call in ``dispatching`` with a lease that runs out. For such a call:

- outcome recorded (ledger hit) -> nothing runs again; the recorded result stands;
- no outcome, capability read-only -> dispatched again;
- no outcome, capability with side effects -> ``result_unknown``, for the reconciler.

Point B records the outcome in the same transaction as the status change, so "outcome
recorded" shows as a call that is past ``dispatching``: a redelivered command for it is
not claimed again (:mod:`dispatcher.worker.claims`), and the sweep, which takes only
``dispatching`` calls, never meets it (:func:`decide` would leave it be).
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sqlalchemy import RowMapping, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import tool_calls
from dispatcher.errors import CapabilityNotFound
from dispatcher.ledger import summaries
from dispatcher.ledger.events import EventType
from dispatcher.ledger.leases import LEASE_RELEASED
from dispatcher.ledger.messages import DispatchCommand, Producer, enqueue
from dispatcher.ledger.transitions import Fence, move
from dispatcher.metrics import RECOVERIES
from dispatcher.settings import Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.states import ReconciliationStatus, VerificationStatus

log = logging.getLogger(__name__)


class Recovery(StrEnum):
    REUSE_RECORDED = "reuse_recorded"
    REDISPATCH = "redispatch"
    MARK_UNKNOWN = "mark_unknown"


def decide(status: S, side_effects: bool) -> Recovery:
    """What to do with a call whose worker died."""
    if status is not S.DISPATCHING:
        return Recovery.REUSE_RECORDED
    return Recovery.MARK_UNKNOWN if side_effects else Recovery.REDISPATCH


@dataclass
class RecoveryReport:
    redispatched: list[str] = field(default_factory=list)
    marked_unknown: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.redispatched) + len(self.marked_unknown)


async def recover_expired(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    *,
    topics: Topics,
    limit: int = 200,
) -> RecoveryReport:
    """Apply the three-way rule to every ``dispatching`` call whose lease expired.

    Several sweepers may run at once (one per worker): ``SKIP LOCKED`` gives each
    call to exactly one of them.
    """
    report = RecoveryReport()
    taken: collections.Counter[tuple[str, str]] = collections.Counter()
    # One move per call: the runs' summaries are written once, at the end, after every
    # call of the sweep is locked (dispatcher.ledger.summaries.deferred).
    async with sessions() as session, session.begin(), summaries.deferred(session):
        for m in await _expired_claims(session, limit):
            try:
                side_effects = registry.get(m["capability_id"]).side_effects
            except CapabilityNotFound:
                side_effects = True  # unknown means we cannot prove it is harmless
            rule = decide(S(m["status"]), side_effects)
            if rule is Recovery.MARK_UNKNOWN:
                await _mark_unknown(session, m, topics)
                report.marked_unknown.append(m["tool_call_id"])
            elif rule is Recovery.REDISPATCH:
                await _redispatch(session, m, topics)
                report.redispatched.append(m["tool_call_id"])
            else:  # Recovery.REUSE_RECORDED: the recorded outcome stands.
                continue
            taken[(rule.value, m["capability_id"])] += 1
    # Counted once committed: a sweep that failed took nothing over.
    for (rule_name, capability), n in taken.items():
        RECOVERIES.labels(rule_name, capability).inc(n)
    if report.total:
        log.info(
            "recovery: %d re-dispatched, %d marked result_unknown",
            len(report.redispatched),
            len(report.marked_unknown),
        )
    return report


async def _expired_claims(session: AsyncSession, limit: int) -> list[RowMapping]:
    """Claims whose lease lapsed, locked for this sweeper (others skip them)."""
    rows = await session.execute(
        select(tool_calls)
        .where(tool_calls.c.status == S.DISPATCHING, tool_calls.c.lease_expires_at < func.now())
        .order_by(tool_calls.c.lease_expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return [row._mapping for row in rows]


def _why(m: RowMapping, rule: Recovery) -> dict[str, Any]:
    return {
        "reason": "worker lost between claim and outcome (lease expired)",
        "deadWorker": m["lease_owner"],
        "claimVersion": m["version"],
        "rule": rule,
    }


async def _mark_unknown(session: AsyncSession, m: RowMapping, topics: Topics) -> None:
    await move(
        session,
        m["tool_call_id"],
        tenant=m["tenant"],
        expected=S.DISPATCHING,
        target=S.RESULT_UNKNOWN,
        event_type=EventType.TOOL_CALL_RESULT_UNKNOWN,
        producer=Producer.RECOVERY,
        topics=topics,
        payload=_why(m, Recovery.MARK_UNKNOWN),
        fence=Fence(m["lease_owner"], m["version"]),
        fields={
            **LEASE_RELEASED,  # the dead worker's lease goes with its claim
            "last_error": "worker_lost: outcome not recorded",
            "reconciliation_status": ReconciliationStatus.PENDING,
            "verification_status": VerificationStatus.PENDING,
            "next_reconcile_at": func.now(),
        },
    )


async def _redispatch(session: AsyncSession, m: RowMapping, topics: Topics) -> None:
    """Back to ``authorized`` with a new dispatch command that names this as its cause."""
    moved = await move(
        session,
        m["tool_call_id"],
        tenant=m["tenant"],
        expected=S.DISPATCHING,
        target=S.AUTHORIZED,
        event_type=EventType.TOOL_CALL_REDISPATCHED,
        producer=Producer.RECOVERY,
        topics=topics,
        payload=_why(m, Recovery.REDISPATCH),
        fields=LEASE_RELEASED,
        fence=Fence(m["lease_owner"], m["version"]),
    )
    command = DispatchCommand.build(
        moved.row._mapping, producer=Producer.RECOVERY, causation_id=moved.event_id
    )
    await enqueue(session, [command.to_outbox_row(topics)])
