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
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import Capability, CapabilityRegistry
from dispatcher.errors import CapabilityNotFound, TransitionConflict
from dispatcher.ledger.events import EventType
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.transitions import Fence
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.contract import Credentials
from dispatcher.provider.transport import Transport
from dispatcher.settings import Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Executor
from reconciler import metrics
from reconciler.due import DueCall, claim_due, database_now
from reconciler.lookup import Answer, CompensationAnswer, ProviderLookup, Reversal, lookup_urls
from reconciler.metrics import Tally
from reconciler.policy import (
    Decision,
    Observation,
    Situation,
    Verdict,
    backoff_seconds,
    decide,
    retry_or_escalate,
)
from reconciler.settle import Finding, Retry, Writer
from reconciler.spans import for_call

log = logging.getLogger(__name__)


def new_reconciler_id() -> str:
    return f"reconciler:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class _Batch:
    """A batch's decisions, grouped by how they are recorded."""

    successes: list[Finding] = field(default_factory=list)
    failures: list[Finding] = field(default_factory=list)
    retries: list[Retry] = field(default_factory=list)
    compensated: list[Finding] = field(default_factory=list)
    escalations: list[tuple[DueCall, str, dict[str, Any]]] = field(default_factory=list)


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
        batches_in_flight: int = 2,
        secrets: Credentials | dict[str, str] | None = None,
    ) -> None:
        self.owner = owner or new_reconciler_id()
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

    async def run(self, stop: asyncio.Event, interval_seconds: float) -> None:
        """Pass after pass until ``stop`` is set; the batch in hand finishes first."""
        while not stop.is_set():
            try:
                tally = await self.run_pass(stop)
                if tally.total:
                    log.info("reconcile pass: %s", ", ".join(tally.lines()))
                await metrics.refresh(self._sessions)
            except Exception:  # the loop must outlive a database or provider outage
                log.exception("reconcile pass failed; trying again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_seconds)

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
        batch = _Batch()
        redispatches: list[tuple[DueCall, Capability, dict[str, Any]]] = []
        compensations: list[tuple[DueCall, Capability, Answer, dict[str, Any]]] = []
        for call, (capability, answer) in zip(calls, answers, strict=True):
            verdict = self._verdict(call, capability, answer)
            evidence = {
                "decision": verdict.decision.value,
                "reason": verdict.reason,
                "attempt": call.reconcile_attempts + 1,
                "lookup": answer.evidence(),
            }
            if verdict.decision is Decision.REDISPATCH and capability is not None:
                redispatches.append((call, capability, evidence))
            elif verdict.decision is Decision.COMPENSATE and capability is not None:
                compensations.append((call, capability, answer, evidence))
            else:
                self._group(batch, call, capability, answer, verdict, evidence)
        compensating = (for_call("compensate", self._compensate, *c) for c in compensations)
        for item in await asyncio.gather(*compensating):
            _put(batch, item)
        await self._record(batch, tally)
        # Each re-send in its own transactions: one that raises leaves its call to the
        # recovery sweep (its lease) or to the next pass, and the others go on.
        outcomes = await asyncio.gather(
            *(for_call("redispatch", self._redispatch, *r) for r in redispatches),
            return_exceptions=True,
        )
        for (call, _, _), outcome in zip(redispatches, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome  # cancelled: the pass stops
                log.error("re-sending %s failed", call.tool_call_id, exc_info=outcome)
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

    @staticmethod
    def _situation(call: DueCall, capability: Capability | None) -> Situation:
        return Situation(
            status=call.status,
            attempts=call.reconcile_attempts,
            redispatches=call.redispatches,
            age_seconds=call.age_seconds,
            compensation_requested=call.compensation_requested,
            can_compensate=capability is not None and capability.compensation is not None,
        )

    def _verdict(self, call: DueCall, capability: Capability | None, answer: Answer) -> Verdict:
        if capability is None:
            return Verdict(Decision.ESCALATE, f"capability {call.capability_id!r} not registered")
        return decide(answer.observation, self._situation(call, capability), capability.reconcile)

    def _group(
        self,
        batch: _Batch,
        call: DueCall,
        capability: Capability | None,
        answer: Answer,
        verdict: Verdict,
        evidence: dict[str, Any],
    ) -> None:
        decision = verdict.decision
        if decision is Decision.CONFIRM_SUCCESS:
            batch.successes.append(
                Finding(call, evidence, answer.result, answer.external_request_id)
            )
        elif decision is Decision.CONFIRM_FAILURE:
            batch.failures.append(
                Finding(call, evidence, answer.result, answer.external_request_id, _error(answer))
            )
        elif decision is Decision.RETRY and capability is not None:
            delay = backoff_seconds(call.reconcile_attempts + 1, capability.reconcile)
            batch.retries.append(Retry(call, delay, evidence, answer.error))
        else:
            batch.escalations.append(
                (call, verdict.reason, self._dossier(call, capability, answer))
            )

    async def _compensate(
        self, call: DueCall, capability: Capability, answer: Answer, evidence: dict[str, Any]
    ) -> tuple[str, Any]:
        external_id = answer.external_request_id or call.external_request_id
        if external_id is None:
            why = "compensation needed, but the provider's request id is unknown"
            return "escalate", (call, why, self._dossier(call, capability, answer))
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
        evidence = {**evidence, "compensation": reply.evidence()}
        if reply.outcome is Reversal.DONE:
            result = {"effect": answer.result, "reversal": reply.body}
            return "compensated", Finding(call, evidence, result, external_id)
        if reply.outcome is Reversal.REFUSED:
            dossier = {**self._dossier(call, capability, answer), "compensation": evidence}
            return "escalate", (call, f"the compensation failed: {reply.error}", dossier)
        verdict = retry_or_escalate(
            self._situation(call, capability),
            capability.reconcile,
            "the compensation got no definitive answer",
        )
        if verdict.decision is Decision.ESCALATE:
            dossier = {**self._dossier(call, capability, answer), "compensation": evidence}
            return "escalate", (call, verdict.reason, dossier)
        delay = backoff_seconds(call.reconcile_attempts + 1, capability.reconcile)
        return "retry", Retry(call, delay, evidence, reply.error)

    def _dossier(
        self, call: DueCall, capability: Capability | None, answer: Answer
    ) -> dict[str, Any]:
        """What the on-call engineer needs beyond the call's own history."""
        return {
            "lastAnswer": answer.evidence(),
            "providerLookup": [
                f"GET {url}"
                for url in lookup_urls(
                    capability,
                    answer.external_request_id or call.external_request_id,
                    call.provider_key,
                )
            ]
            if capability is not None
            else [],
            "policy": capability.reconcile.model_dump(by_alias=True, mode="json")
            if capability is not None
            else None,
        }

    async def _record(self, batch: _Batch, tally: Tally) -> None:
        writer = self._writer
        async with self._sessions() as session, session.begin():
            confirmed = await writer.confirm(session, batch.successes, succeeded=True)
            refuted = await writer.confirm(session, batch.failures, succeeded=False)
            retried = await writer.retry(session, batch.retries)
            tally.add("confirmed_success", len(confirmed))
            tally.add("confirmed_failure", len(refuted))
            tally.add("retry_later", len(retried))
            lost = (
                len(batch.successes)
                + len(batch.failures)
                + len(batch.retries)
                - len(confirmed)
                - len(refuted)
                - len(retried)
            )
            for finding in batch.compensated:
                ok = await self._fenced(session, writer.compensated(session, finding))
                tally.add("compensated" if ok else "taken_over")
            for call, reason, dossier in batch.escalations:
                ok = await self._fenced(
                    session, writer.escalate(session, call, reason=reason, evidence=dossier)
                )
                tally.add("escalated" if ok else "taken_over")
            tally.add("taken_over", lost)

    @staticmethod
    async def _fenced(session: AsyncSession, write: Any) -> bool:
        """Run one per-call write in a savepoint; False when the call was taken over."""
        try:
            async with session.begin_nested():
                await write
        except TransitionConflict:
            return False
        return True

    async def _redispatch(
        self, call: DueCall, capability: Capability, evidence: dict[str, Any]
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


def _error(answer: Answer) -> str:
    return answer.error or f"provider reports {answer.observation.value}"


def _put(batch: _Batch, item: tuple[str, Any]) -> None:
    kind, value = item
    if kind == "compensated":
        batch.compensated.append(value)
    elif kind == "retry":
        batch.retries.append(value)
    else:
        batch.escalations.append(value)


async def reconcile_once(
    reconcilers: Sequence[Reconciler],
) -> Tally:
    """One pass of each reconciler, all at once (what overlapping cron runs do)."""
    tally = Tally()
    for one in await asyncio.gather(*(r.run_pass() for r in reconcilers)):
        tally.merge(one)
    return tally
