"""The reconciler: claim due calls in batches, look them up concurrently, decide by
policy, and record every settlement.

One batch is: a committed claim (``FOR UPDATE SKIP LOCKED`` plus a lease), every
lookup in flight at once over the process's provider transport, then one transaction
recording the confirmations, retries, compensations and escalations. Re-sends go
through the dispatcher's own executor (point A committed before the request leaves,
point B fenced), each in its own transactions. Two batches are in flight per pass, so
one's lookups overlap the other's database writes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import Capability, CapabilityRegistry
from dispatcher.errors import CapabilityNotFound, TransitionConflict
from dispatcher.ledger.events import EventType
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.pauses import paused_scopes
from dispatcher.ledger.transitions import Fence
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.contract import Credentials
from dispatcher.provider.transport import Transport
from dispatcher.settings import Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Executor
from kit.owners import owner_id
from kit.periodic import periodic
from reconciler import metrics
from reconciler.due import DueCall, claim_due, database_now
from reconciler.lookup import Answer, CompensationAnswer, ProviderLookup, Reversal
from reconciler.metrics import Tally
from reconciler.policy import Observation
from reconciler.record import Writer
from reconciler.rulings import (
    Compensated,
    Compensation,
    Escalation,
    Redispatch,
    Retry,
    Rulings,
    after_reversal,
    held_if_paused,
    rule,
    unaddressed,
)
from reconciler.spans import for_call

log = logging.getLogger(__name__)

LOOP = "reconcile"
"""The ``loop`` label of the service loop's step metrics and the name in its log lines."""
BATCHES_IN_FLIGHT = 2
"""Batches a pass keeps in flight by default: one's lookups overlap the other's writes."""
GAUGES_LOOP = "reconciler_gauges"
"""The loop that refreshes the reconciler's gauges (:func:`reconciler.metrics.refresh`)."""


class Reconciler:
    """Settles calls in doubt for one identity (the lease owner of its claims)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        registry: CapabilityRegistry,
        transport: Transport,
        *,
        topics: Topics,
        owner: str | None = None,
        batch_size: int = 200,
        concurrency: int = 64,
        lease_seconds: float = 60.0,
        batches_in_flight: int = BATCHES_IN_FLIGHT,
        secrets: Credentials | dict[str, str] | None = None,
    ) -> None:
        self.owner = owner or owner_id("reconciler")
        self._sessions = sessions
        self._registry = registry
        self._lookup = ProviderLookup(transport, secrets)
        self._executor = Executor(
            sessions,
            registry,
            ProviderClient(transport, secrets),
            worker_id=self.owner,
            topics=topics,
            producer=Producer.RECONCILER,
        )
        self._writer = Writer(self.owner, topics)
        self._batch_size = batch_size
        self._lease_seconds = lease_seconds
        self._batches_in_flight = batches_in_flight
        self._in_flight = asyncio.Semaphore(concurrency)

    async def run_pass(self, stop: asyncio.Event | None = None) -> Tally:
        """Settle every call that is due when the pass starts (the cron job's unit).

        Calls put off during the pass wait for a later one, so a pass always ends."""
        async with self._sessions() as session:
            due_by = await database_now(session)
        tally = Tally()

        async def lane() -> None:
            while stop is None or not stop.is_set():
                if not await self.run_batch(tally, due_by):
                    return

        await asyncio.gather(*(lane() for _ in range(self._batches_in_flight)))
        return tally

    async def run(
        self, stop: asyncio.Event, interval_seconds: float, gauges_seconds: float | None = None
    ) -> None:
        """Pass after pass until ``stop`` is set; the batch in hand finishes first.

        The first pass starts at once; a pass that raises (the database or the provider
        away) is logged and counted, and the next waits longer (:func:`periodic`). The
        gauges are refreshed beside the passes, every ``gauges_seconds`` (default: the
        passes' interval), in a loop of their own: a slow or failing read of them never
        delays a pass, and a long pass never leaves them stale."""

        async def step() -> None:
            tally = await self.run_pass(stop)
            if tally.total:
                log.info("reconcile pass: %s", ", ".join(tally.lines()))

        async def gauges() -> None:
            await metrics.refresh(self._sessions)

        every = gauges_seconds if gauges_seconds is not None else interval_seconds
        await asyncio.gather(
            periodic(stop, interval_seconds, step, name=LOOP),
            periodic(stop, every, gauges, name=GAUGES_LOOP),
        )

    async def run_batch(self, tally: Tally, due_by: datetime | None = None) -> int:
        """Claim, look up, decide and record one batch; returns how many were claimed."""
        async with self._sessions() as session, session.begin():
            calls = await claim_due(
                session,
                owner=self.owner,
                limit=self._batch_size,
                lease_seconds=self._lease_seconds,
                due_by=due_by,
            )
        if not calls:
            return 0
        answers = await asyncio.gather(*(for_call("lookup", self._look, c) for c in calls))
        async with self._sessions() as session:
            paused = await paused_scopes(session)
        rulings = Rulings()
        redispatches: list[Redispatch] = []
        compensations: list[Compensation] = []
        for call, (capability, answer) in zip(calls, answers, strict=True):
            match held_if_paused(rule(call, capability, answer), paused):
                case Redispatch() as redispatch:
                    redispatches.append(redispatch)
                case Compensation() as compensation:
                    compensations.append(compensation)
                case ruling:
                    rulings.put(ruling)
        compensating = (
            for_call("compensate", self._compensate, c.call, c.capability, c.answer, c.evidence)
            for c in compensations
        )
        for reversal in await asyncio.gather(*compensating):
            rulings.put(reversal)
        async with self._sessions() as session, session.begin():
            await self._writer.record(session, rulings, tally)
        # Each re-send in its own transactions: one that raises leaves its call to the
        # recovery sweep (its lease) or to the next pass, and the others go on.
        outcomes = await asyncio.gather(
            *(
                for_call("redispatch", self._redispatch, r.call, r.capability, r.evidence)
                for r in redispatches
            ),
            return_exceptions=True,
        )
        for redispatch, outcome in zip(redispatches, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome  # cancelled: the pass stops
                log.error("re-sending %s failed", redispatch.call.tool_call_id, exc_info=outcome)
        tally.add("redispatched", sum(1 for ok in outcomes if ok is True))
        tally.add("taken_over", sum(1 for ok in outcomes if ok is False))
        tally.add("redispatch_failed", sum(1 for ok in outcomes if isinstance(ok, Exception)))
        return len(calls)

    async def _look(self, call: DueCall) -> tuple[Capability | None, Answer]:
        try:
            capability = self._registry.get(call.capability_id)
        except CapabilityNotFound:
            return None, Answer(Observation.UNKNOWABLE, "none", error="capability not registered")
        window = capability.reconcile.idempotency_window_seconds
        try:
            async with self._in_flight:
                answer = await self._lookup.look_up(
                    capability,
                    tenant=call.tenant,
                    external_request_id=call.external_request_id,
                    idempotency_key=call.provider_key,
                    key_still_remembered=call.age_seconds < window,
                )
        except Exception as exc:
            # This call's own evidence, not the pass's end: a lookup is a read, so the
            # call is simply not settled yet (retried, then escalated by policy).
            log.exception("looking up %s failed", call.tool_call_id)
            error = f"lookup could not be made: {type(exc).__name__}"
            answer = Answer(Observation.LOOKUP_FAILED, "none", error=error)
        if answer.observation is Observation.LOOKUP_FAILED:
            metrics.LOOKUP_ERRORS.labels(capability.id).inc()
        return capability, answer

    async def _compensate(
        self, call: DueCall, capability: Capability, answer: Answer, evidence: Mapping[str, Any]
    ) -> Compensated | Retry | Escalation:
        """Ask the provider to undo the effect ``answer`` found, and rule on its reply."""
        pending = Compensation(call, capability, answer, evidence)
        external_id = answer.external_request_id or call.external_request_id
        if external_id is None:
            return unaddressed(pending)
        try:
            async with self._in_flight:
                reply = await self._lookup.compensate(
                    capability,
                    tenant=call.tenant,
                    external_request_id=external_id,
                    idempotency_key=call.provider_key,
                )
        except Exception as exc:
            # It may have been sent: no definitive answer, asked again (same key).
            log.exception("compensating %s failed", call.tool_call_id)
            reply = CompensationAnswer(
                Reversal.UNKNOWN, error=f"compensation: {type(exc).__name__}"
            )
        return after_reversal(pending, reply, external_id)

    async def _redispatch(
        self, call: DueCall, capability: Capability, evidence: Mapping[str, Any]
    ) -> bool:
        """Send the call again with its own key: claim (point A, committed), send,
        record (point B, fenced), exactly as a worker does."""
        try:
            async with self._sessions() as session, session.begin():
                claim = await self._executor.claim_in(
                    session,
                    call.tool_call_id,
                    capability,
                    tenant=call.tenant,
                    expected=S.RESULT_UNKNOWN,
                    dispatch_attempts=call.dispatch_attempts,
                    event_type=EventType.TOOL_CALL_REDISPATCHED,
                    payload={**evidence, "redispatch": call.redispatches + 1},
                    fence=Fence(self.owner, call.version),
                    settles=True,
                )
        except TransitionConflict:
            return False
        async with self._in_flight:
            await self._executor.run(claim)
        return True


async def reconcile_once(
    reconcilers: Sequence[Reconciler],
) -> Tally:
    """One pass of each reconciler, all at once (what overlapping cron runs do)."""
    tally = Tally()
    for one in await asyncio.gather(*(r.run_pass() for r in reconcilers)):
        tally.merge(one)
    return tally
