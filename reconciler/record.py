"""Recording what the reconciler ruled, in the caller's transaction.

Every write is fenced by the reconciler's claim (lease owner and version, see
:mod:`reconciler.due`): a call another reconciler took over is left alone. Status
changes go through :func:`dispatcher.ledger.transitions.move` / ``move_many`` (their
events and outbox rows in the same transaction); a lookup that settles nothing leaves
a ``tool.call.reconcile_attempted`` event
(:func:`dispatcher.ledger.marks.schedule_next_looks`), so the log holds every attempt
and answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.control.escalations import escalate
from dispatcher.db.tables import tool_calls
from dispatcher.errors import TransitionConflict
from dispatcher.ledger import summaries
from dispatcher.ledger.events import EventType
from dispatcher.ledger.leases import LEASE_RELEASED
from dispatcher.ledger.marks import NextLook, schedule_next_looks
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.transitions import BulkMove, Fence, move, move_many
from dispatcher.schemas import EscalationView
from dispatcher.settings import Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.states import ReconciliationStatus, VerificationStatus
from reconciler.due import FOLLOWED_UP, DueCall
from reconciler.metrics import Tally
from reconciler.rulings import Retry, Rulings, Settlement


@dataclass
class Writer:
    """Writes settlements for one reconciler identity (its claims' lease owner)."""

    owner: str
    topics: Topics
    producer: Producer = Producer.RECONCILER

    async def record(self, session: AsyncSession, rulings: Rulings, tally: Tally) -> None:
        """A batch's rulings, counted in ``tally``: confirmations and retries a
        statement each, compensations and escalations one savepoint each (a call
        taken over is counted as such, and the others are recorded).

        Several moves in one transaction: the runs' summaries are written once, at the
        end (:func:`dispatcher.ledger.summaries.deferred`)."""
        async with summaries.deferred(session):
            await self._record(session, rulings, tally)

    async def _record(self, session: AsyncSession, rulings: Rulings, tally: Tally) -> None:
        confirmed = await self.confirm(session, rulings.successes, succeeded=True)
        refuted = await self.confirm(session, rulings.failures, succeeded=False)
        retried = await self.retry(session, rulings.retries)
        tally.add("confirmed_success", len(confirmed))
        tally.add("confirmed_failure", len(refuted))
        tally.add("retry_later", len(retried))
        lost = (
            len(rulings.successes)
            + len(rulings.failures)
            + len(rulings.retries)
            - len(confirmed)
            - len(refuted)
            - len(retried)
        )
        for settlement in rulings.compensated:
            ok = await _fenced(session, self.compensated(session, settlement))
            tally.add("compensated" if ok else "taken_over")
        for escalation in rulings.escalations:
            ok = await _fenced(
                session,
                self.escalate(
                    session, escalation.call, reason=escalation.reason, evidence=escalation.dossier
                ),
            )
            tally.add("escalated" if ok else "taken_over")
        tally.add("taken_over", lost)

    async def confirm(
        self, session: AsyncSession, settlements: Sequence[Settlement], *, succeeded: bool
    ) -> list[str]:
        """``-> confirmed`` with verification confirmed_success / confirmed_failure, in
        three statements whatever the batch size; returns the calls moved."""
        verified = (
            VerificationStatus.CONFIRMED_SUCCESS
            if succeeded
            else VerificationStatus.CONFIRMED_FAILURE
        )
        moved = await move_many(
            session,
            [
                BulkMove(
                    s.call.tool_call_id,
                    s.call.version,
                    values={
                        "result": s.result,
                        "external_request_id": s.external_request_id or s.call.external_request_id,
                        "last_error": s.error,
                    },
                    payload=s.evidence,
                    tenant=s.call.tenant,
                )
                for s in settlements
            ],
            expected=FOLLOWED_UP,
            target=S.CONFIRMED,
            event_type=EventType.TOOL_CALL_CONFIRMED,
            producer=self.producer,
            lease_owner=self.owner,
            topics=self.topics,
            fields={
                **LEASE_RELEASED,
                "verification_status": verified.value,
                "reconciliation_status": ReconciliationStatus.SETTLED.value,
                "next_reconcile_at": None,
                "completed_at": func.now(),
                "reconcile_attempts": tool_calls.c.reconcile_attempts + 1,
            },
        )
        return [m.row.tool_call_id for m in moved]

    async def retry(self, session: AsyncSession, retries: Sequence[Retry]) -> list[str]:
        """Schedule the next look (no status change) and log the attempt."""
        return await schedule_next_looks(
            session,
            [
                NextLook(
                    r.call.tool_call_id,
                    r.call.version,
                    r.delay_seconds,
                    r.evidence,
                    r.error,
                    tenant=r.call.tenant,
                    counted=r.counted,
                )
                for r in retries
            ],
            owner=self.owner,
            expected=FOLLOWED_UP,
            producer=self.producer,
            topics=self.topics,
        )

    async def escalate(
        self, session: AsyncSession, call: DueCall, *, reason: str, evidence: Mapping[str, Any]
    ) -> EscalationView:
        """``-> escalated`` plus the escalation record and its message (exactly once:
        see :mod:`dispatcher.control.escalations`). Raises TransitionConflict if taken over."""
        return await escalate(
            session,
            call.tool_call_id,
            tenant=call.tenant,
            expected=call.status,
            reason=reason,
            evidence=evidence,
            producer=self.producer,
            fence=Fence(self.owner, call.version),
            topics=self.topics,
            fields={"reconcile_attempts": tool_calls.c.reconcile_attempts + 1},
        )

    async def compensated(self, session: AsyncSession, settlement: Settlement) -> None:
        """``-> compensated``: the effect happened and the provider undid it."""
        call = settlement.call
        await move(
            session,
            call.tool_call_id,
            tenant=call.tenant,
            expected=call.status,
            target=S.COMPENSATED,
            event_type=EventType.TOOL_CALL_COMPENSATED,
            producer=self.producer,
            topics=self.topics,
            fence=Fence(self.owner, call.version),
            payload=settlement.evidence,
            fields={
                **LEASE_RELEASED,
                "verification_status": VerificationStatus.CONFIRMED_SUCCESS,
                "reconciliation_status": ReconciliationStatus.SETTLED,
                "next_reconcile_at": None,
                "completed_at": func.now(),
                "result": settlement.result,
                "external_request_id": settlement.external_request_id or call.external_request_id,
                "reconcile_attempts": tool_calls.c.reconcile_attempts + 1,
            },
        )


async def _fenced(session: AsyncSession, write: Awaitable[Any]) -> bool:
    """Run one per-call write in a savepoint; False when the call was taken over (its
    moves are then not counted in the runs' summaries either)."""
    try:
        async with session.begin_nested(), summaries.deferred(session):
            await write
    except TransitionConflict:
        return False
    return True
