"""Executing one tool call: claim it (point A), call the provider, record what really
happened (point B).

Point A commits ``authorized -> dispatching`` with a lease BEFORE the request leaves,
so a crash after it is visible to the recovery sweep. Point B commits the outcome,
its events and their outbox rows together, fenced by the lease owner and version the
claim took: a worker that stalled past its lease cannot record anything.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import Capability, CapabilityRegistry
from dispatcher.crashpoints import CrashPoints
from dispatcher.errors import CapabilityNotFound, TransitionConflict
from dispatcher.events import EventType
from dispatcher.provider import DispatchRequest, OutcomeKind, ProviderClient, ProviderOutcome
from dispatcher.states import ExecutionStatus as S
from dispatcher.states import ReconciliationStatus, VerificationStatus
from dispatcher.tables import tool_calls
from dispatcher.transitions import move

log = logging.getLogger(__name__)
PRODUCER = "tool-dispatcher.worker"


@dataclass(frozen=True, slots=True)
class Claim:
    tool_call_id: str
    capability: Capability
    idempotency_key: str
    input: dict[str, Any]
    correlation_id: str | None
    version: int
    lease_seconds: float
    claimed_at: float
    # A reconciler's re-send: a final answer settles the call (-> confirmed) instead of
    # completing or failing it, because the call was already in doubt.
    settles: bool = False


def lease_seconds(capability: Capability, minimum: float, margin: float) -> float:
    """Long enough for every attempt the retry policy allows, plus a margin: a lease
    that lapses while the worker is still legitimately sending would hand a live call
    to the recovery sweep."""
    policy = capability.retry
    worst = (
        capability.request.timeout_seconds * policy.max_attempts
        + policy.max_backoff_seconds * (policy.max_attempts - 1)
    )
    return max(minimum, worst + margin)


class Executor:
    """Runs dispatch commands for one worker identity."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        registry: CapabilityRegistry,
        provider: ProviderClient,
        *,
        worker_id: str,
        events_topic: str,
        min_lease_seconds: float = 10.0,
        lease_margin_seconds: float = 5.0,
        crash: CrashPoints | None = None,
        producer: str = PRODUCER,
    ) -> None:
        self._sessions = sessions
        self._producer = producer
        self._registry = registry
        self._provider = provider
        self.worker_id = worker_id
        self._events_topic = events_topic
        self._min_lease = min_lease_seconds
        self._lease_margin = lease_margin_seconds
        self._crash = crash or CrashPoints()

    async def execute(self, tool_call_id: str) -> S | None:
        """Run the call if it is still ``authorized``; returns the recorded status, or
        None when the command was a duplicate or another worker got there first."""
        claim = await self.claim(tool_call_id)
        if claim is None:
            return None
        return await self.run(claim)

    async def run(self, claim: Claim) -> S | None:
        """Send a claimed call (its lease committed) and record the outcome."""
        tool_call_id = claim.tool_call_id
        self._crash.hit("after-claim")
        if time.monotonic() - claim.claimed_at > claim.lease_seconds:
            # Stalled before sending: the recovery sweep owns the call now.
            log.warning("lease of %s lapsed before sending; not sending", tool_call_id)
            return None
        outcome = await self._provider.dispatch(
            claim.capability,
            DispatchRequest(
                claim.tool_call_id,
                claim.idempotency_key,
                claim.input,
                trace_seed=claim.correlation_id or claim.tool_call_id,
            ),
        )
        self._crash.hit("after-send")
        status = await self.record(claim, outcome)
        self._crash.hit("after-record")
        return status

    async def claim(self, tool_call_id: str) -> Claim | None:
        """Point A: ``authorized -> dispatching`` under this worker's lease, committed."""
        async with self._sessions() as session, session.begin():
            found = (
                await session.execute(
                    select(
                        tool_calls.c.status,
                        tool_calls.c.capability_id,
                        tool_calls.c.dispatch_attempts,
                    ).where(tool_calls.c.tool_call_id == tool_call_id)
                )
            ).first()
            if found is None or found.status != S.AUTHORIZED:
                return None
            peek = found._mapping
            try:
                capability = self._registry.get(peek["capability_id"])
            except CapabilityNotFound:
                log.error("call %s names an unregistered capability", tool_call_id)
                return None
            try:
                return await self.claim_in(
                    session,
                    tool_call_id,
                    capability,
                    expected=S.AUTHORIZED,
                    dispatch_attempts=peek["dispatch_attempts"],
                )
            except TransitionConflict:
                return None

    async def claim_in(
        self,
        session: AsyncSession,
        tool_call_id: str,
        capability: Capability,
        *,
        expected: S,
        dispatch_attempts: int,
        event_type: EventType = EventType.TOOL_CALL_DISPATCHING,
        payload: dict[str, Any] | None = None,
        lease_owner: str | None = None,
        version: int | None = None,
        settles: bool = False,
    ) -> Claim:
        """Move ``expected -> dispatching`` under this worker's lease in the caller's
        transaction (the caller's commit is point A). ``lease_owner`` and ``version``
        fence the move as in :func:`move`; raises :class:`TransitionConflict`."""
        lease = lease_seconds(capability, self._min_lease, self._lease_margin)
        row = await move(
            session,
            tool_call_id,
            expected=expected,
            target=S.DISPATCHING,
            event_type=event_type,
            producer=self._producer,
            events_topic=self._events_topic,
            fields={
                "lease_owner": self.worker_id,
                "lease_expires_at": func.now() + timedelta(seconds=lease),
                # A re-send keeps the first dispatch time: the provider's idempotency
                # window is counted from it.
                "dispatched_at": func.coalesce(tool_calls.c.dispatched_at, func.now())
                if settles
                else func.now(),
                "dispatch_attempts": dispatch_attempts + 1,
            },
            payload={"worker": self.worker_id, "leaseSeconds": lease, **(payload or {})},
            lease_owner=lease_owner,
            version=version,
        )
        m = row._mapping
        return Claim(
            m["tool_call_id"],
            capability,
            m["idempotency_key"],
            m["input"],
            m["correlation_id"],
            m["version"],
            lease,
            time.monotonic(),
            settles,
        )

    async def record(self, claim: Claim, outcome: ProviderOutcome) -> S | None:
        """Point B: the outcome, its events and outbox rows, in one fenced transaction."""
        try:
            async with self._sessions() as session, session.begin():
                return await self._record(session, claim, outcome)
        except TransitionConflict:
            # Fenced out: our lease lapsed and the recovery sweep (or another worker)
            # took the call over. What we saw is not recorded; the reconciler asks the
            # provider, which holds the truth under the same idempotency key.
            log.warning("outcome of %s not recorded: lease lost", claim.tool_call_id)
            return None

    async def _record(self, session: AsyncSession, claim: Claim, outcome: ProviderOutcome) -> S:
        released: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}
        if outcome.external_request_id:
            released["external_request_id"] = outcome.external_request_id
        evidence: dict[str, Any] = {
            "httpStatus": outcome.http_status,
            "attempts": outcome.attempts,
            "externalRequestId": outcome.external_request_id,
            "error": outcome.error,
        }

        async def step(
            expected: S, target: S, event: EventType, fields: dict[str, Any], fenced: bool = True
        ) -> None:
            await move(
                session,
                claim.tool_call_id,
                expected=expected,
                target=target,
                event_type=event,
                producer=self._producer,
                events_topic=self._events_topic,
                fields=fields,
                payload=evidence,
                lease_owner=self.worker_id if fenced else None,
                version=claim.version if fenced else None,
            )

        kind = outcome.kind
        if claim.settles and (
            kind is OutcomeKind.COMPLETED
            or (kind is OutcomeKind.FAILED and outcome.http_status is not None)
        ):
            return await self._settle(step, outcome)
        if claim.settles and kind is OutcomeKind.NOT_SENT:
            # The re-send never reached the provider: still in doubt, look again later.
            kind = OutcomeKind.UNKNOWN
        if kind is OutcomeKind.COMPLETED:
            await step(
                S.DISPATCHING,
                S.ACCEPTED,
                EventType.TOOL_CALL_ACCEPTED,
                {**released, "accepted_at": func.now()},
            )
            # Same transaction, row already locked by the first step: no fence needed.
            await step(
                S.ACCEPTED,
                S.COMPLETED,
                EventType.TOOL_CALL_COMPLETED,
                {
                    "completed_at": func.now(),
                    "result": outcome.result,
                    "verification_status": VerificationStatus.CONFIRMED_SUCCESS,
                },
                fenced=False,
            )
            return S.COMPLETED
        if kind is OutcomeKind.ACCEPTED:
            await step(
                S.DISPATCHING,
                S.ACCEPTED,
                EventType.TOOL_CALL_ACCEPTED,
                {
                    **released,
                    **self._follow_up(claim.capability),
                    "accepted_at": func.now(),
                    "verification_status": VerificationStatus.PENDING,
                },
            )
            return S.ACCEPTED
        if kind in (OutcomeKind.FAILED, OutcomeKind.NOT_SENT):
            # Only a provider's own answer confirms a failure; exhausted connection
            # attempts prove nothing reached it, which is "not observed".
            verified = (
                VerificationStatus.CONFIRMED_FAILURE
                if outcome.http_status
                else VerificationStatus.NOT_OBSERVED
            )
            await step(
                S.DISPATCHING,
                S.FAILED,
                EventType.TOOL_CALL_FAILED,
                {
                    **released,
                    "completed_at": func.now(),
                    "last_error": outcome.error,
                    "result": outcome.result,
                    "verification_status": verified,
                },
            )
            return S.FAILED
        await step(
            S.DISPATCHING,
            S.RESULT_UNKNOWN,
            EventType.TOOL_CALL_RESULT_UNKNOWN,
            {
                **released,
                **self._follow_up(claim.capability),
                "last_error": outcome.error,
                "verification_status": VerificationStatus.PENDING,
            },
        )
        return S.RESULT_UNKNOWN

    @staticmethod
    async def _settle(step: Any, outcome: ProviderOutcome) -> S:
        """A re-sent call's final answer: ``dispatching -> accepted -> confirmed``."""
        succeeded = outcome.kind is OutcomeKind.COMPLETED
        await step(
            S.DISPATCHING,
            S.ACCEPTED,
            EventType.TOOL_CALL_ACCEPTED,
            {"lease_owner": None, "lease_expires_at": None, "accepted_at": func.now()}
            | (
                {"external_request_id": outcome.external_request_id}
                if outcome.external_request_id
                else {}
            ),
        )
        await step(
            S.ACCEPTED,
            S.CONFIRMED,
            EventType.TOOL_CALL_CONFIRMED,
            {
                "completed_at": func.now(),
                "result": outcome.result,
                "last_error": None if succeeded else outcome.error,
                "reconciliation_status": ReconciliationStatus.SETTLED,
                "next_reconcile_at": None,
                "verification_status": VerificationStatus.CONFIRMED_SUCCESS
                if succeeded
                else VerificationStatus.CONFIRMED_FAILURE,
            },
            False,
        )
        return S.CONFIRMED

    @staticmethod
    def _follow_up(capability: Capability) -> dict[str, Any]:
        return {
            "reconciliation_status": ReconciliationStatus.PENDING,
            "next_reconcile_at": func.now()
            + timedelta(seconds=capability.reconcile.initial_delay_seconds),
        }
