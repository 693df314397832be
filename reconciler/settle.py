"""Recording what the reconciler decided, in the caller's transaction.

Every write is fenced by the reconciler's claim (lease owner and version, see
:mod:`reconciler.due`): a call another reconciler took over is left alone. Status
changes go through :func:`dispatcher.ledger.transitions.move` / ``move_many`` (their events
and outbox rows in the same transaction); a lookup that settles nothing leaves a
``tool.call.reconcile_attempted`` event, so the log holds every attempt and answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Float, Integer, Text, cast, column, func, update, values
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.control.escalations import escalate
from dispatcher.db.tables import tool_calls
from dispatcher.ledger.events import CallContext, EventType, event_row, record_events
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.transitions import BulkMove, Fence, move, move_many
from dispatcher.schemas import EscalationView
from dispatcher.settings import Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.states import ReconciliationStatus, VerificationStatus
from reconciler.due import FOLLOWED_UP, DueCall

_RELEASED: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}


@dataclass(frozen=True, slots=True)
class Finding:
    """One call's settlement: its outcome and the evidence for it."""

    call: DueCall
    evidence: Mapping[str, Any]
    result: Any = None
    external_request_id: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """A call to look at again after ``delay_seconds``."""

    call: DueCall
    delay_seconds: float
    evidence: Mapping[str, Any]
    error: str | None = None


@dataclass
class Writer:
    """Writes settlements for one reconciler identity (its claims' lease owner)."""

    owner: str
    topics: Topics
    producer: Producer = Producer.RECONCILER

    async def confirm(
        self, session: AsyncSession, findings: Sequence[Finding], *, succeeded: bool
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
                    f.call.tool_call_id,
                    f.call.version,
                    values={
                        "result": f.result,
                        "external_request_id": f.external_request_id or f.call.external_request_id,
                        "last_error": f.error,
                    },
                    payload=f.evidence,
                    tenant=f.call.tenant,
                )
                for f in findings
            ],
            expected=FOLLOWED_UP,
            target=S.CONFIRMED,
            event_type=EventType.TOOL_CALL_CONFIRMED,
            producer=self.producer,
            lease_owner=self.owner,
            topics=self.topics,
            fields={
                **_RELEASED,
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
        if not retries:
            return []
        rows = values(
            column("tenant", Text),
            column("tool_call_id", Text),
            column("fence_version", Integer),
            column("delay", Float),
            column("error", Text),
            name="v",
        ).data(
            [
                (r.call.tenant, r.call.tool_call_id, r.call.version, r.delay_seconds, r.error)
                for r in retries
            ]
        )
        updated = await session.execute(
            update(tool_calls)
            .where(
                tool_calls.c.tenant == rows.c.tenant,
                tool_calls.c.tool_call_id == rows.c.tool_call_id,
                tool_calls.c.version == rows.c.fence_version,
                tool_calls.c.lease_owner == self.owner,
                tool_calls.c.status.in_([s.value for s in FOLLOWED_UP]),
            )
            .values(
                **_RELEASED,
                reconcile_attempts=tool_calls.c.reconcile_attempts + 1,
                next_reconcile_at=func.now()
                + func.make_interval(0, 0, 0, 0, 0, 0, cast(rows.c.delay, Float)),
                last_error=func.coalesce(cast(rows.c.error, Text), tool_calls.c.last_error),
                version=tool_calls.c.version + 1,
                updated_at=func.now(),
            )
            .returning(*tool_calls.c)
        )
        by_key = {(r.call.tenant, r.call.tool_call_id): r for r in retries}
        events = []
        for row in updated:
            retry = by_key[(row.tenant, row.tool_call_id)]
            events.append(
                event_row(
                    EventType.TOOL_CALL_RECONCILE_ATTEMPTED,
                    CallContext.of(row._mapping),
                    producer=self.producer,
                    payload={
                        **retry.evidence,
                        "attempt": row.reconcile_attempts,
                        "nextInSeconds": retry.delay_seconds,
                    },
                )
            )
        await record_events(session, events, topics=self.topics)
        return [e["tool_call_id"] for e in events]

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

    async def compensated(self, session: AsyncSession, finding: Finding) -> None:
        """``-> compensated``: the effect happened and the provider undid it."""
        await move(
            session,
            finding.call.tool_call_id,
            tenant=finding.call.tenant,
            expected=finding.call.status,
            target=S.COMPENSATED,
            event_type=EventType.TOOL_CALL_COMPENSATED,
            producer=self.producer,
            topics=self.topics,
            fence=Fence(self.owner, finding.call.version),
            payload=finding.evidence,
            fields={
                **_RELEASED,
                "verification_status": VerificationStatus.CONFIRMED_SUCCESS,
                "reconciliation_status": ReconciliationStatus.SETTLED,
                "next_reconcile_at": None,
                "completed_at": func.now(),
                "result": finding.result,
                "external_request_id": finding.external_request_id
                or finding.call.external_request_id,
                "reconcile_attempts": tool_calls.c.reconcile_attempts + 1,
            },
        )
