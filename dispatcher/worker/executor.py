"""Executing tool calls: claim them (point A), call the provider, record what really
happened (point B), a batch at a time.

Point A commits ``authorized -> dispatching`` with a lease BEFORE any request leaves,
so a crash after it is visible to the recovery sweep. Point B commits the outcomes,
their events and their outbox rows together, each call fenced by the lease owner and
version its claim took: a worker that stalled past its lease cannot record anything.

A batch is one claim transaction (:mod:`dispatcher.worker.claims`), its requests in flight
at once (bounded by the provider client), and one record transaction
(:mod:`dispatcher.worker.outcomes`). The single-call methods are batches of one. The crash
points ``after-claim``, ``after-send`` and ``after-record`` are passed once per batch,
at the same commit boundaries as for a single call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.context import Context
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import Capability, CapabilityRegistry
from dispatcher.errors import TransitionConflict
from dispatcher.ledger.events import EventType
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.transitions import BulkMove, Fence
from dispatcher.logs import log_context
from dispatcher.metrics import DISPATCH_OUTCOMES, DISPATCH_SECONDS, FENCED_OUTCOMES
from dispatcher.provider.client import (
    DispatchRequest,
    OutcomeKind,
    ProviderClient,
    ProviderOutcome,
)
from dispatcher.settings import Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker import spans
from dispatcher.worker.claims import Claim, claim_calls, lease_seconds
from dispatcher.worker.crashpoints import CrashPoints
from dispatcher.worker.outcomes import OutcomeRecorder, Sent
from kit import telemetry

__all__ = ["CallKey", "Claim", "Executor", "lease_seconds"]

CallKey = tuple[str, str]
"""A call as ``(tenant, tool_call_id)``: a toolCallId is unique only within its tenant."""

log = logging.getLogger(__name__)


class Executor:
    """Runs dispatch commands for one worker identity."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        registry: CapabilityRegistry,
        provider: ProviderClient,
        *,
        worker_id: str,
        topics: Topics,
        min_lease_seconds: float = 10.0,
        lease_margin_seconds: float = 5.0,
        crash: CrashPoints | None = None,
        producer: Producer = Producer.WORKER,
        concurrency: int | None = None,
    ) -> None:
        self._sessions = sessions
        self._producer = producer
        self._provider = provider
        self.worker_id = worker_id
        self._topics = topics
        self._min_lease = min_lease_seconds
        self._lease_margin = lease_margin_seconds
        self._crash = crash or CrashPoints()
        self._capabilities = {cap.id: cap for cap in registry}
        self._leases = {cap.id: self.lease_of(cap) for cap in registry}
        self._recorder = OutcomeRecorder(worker_id, producer, topics)
        # Requests in flight at once (None: a batch's all together).
        self._concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency) if concurrency else None

    def _rounds(self, calls: int) -> int:
        return -(-calls // self._concurrency) if self._concurrency else 1

    def longest_batch_seconds(self, calls: int) -> float:
        """How long a batch of ``calls`` may take at worst: the longest lease it takes.
        The consumer may go that long between two fetches (max.poll.interval)."""
        return max(self._leases.values(), default=0.0) * self._rounds(calls)

    def lease_of(self, capability: Capability) -> float:
        """The lease a claim of one call of ``capability`` takes."""
        return lease_seconds(capability, self._min_lease, self._lease_margin)

    @property
    def producer(self) -> Producer:
        return self._producer

    async def execute(self, tool_call_id: str, tenant: str) -> S | None:
        """Run the call if it is still ``authorized``; returns the recorded status, or
        None when the command was a duplicate or another worker got there first."""
        return (await self.execute_many([(tenant, tool_call_id)])).get((tenant, tool_call_id))

    async def execute_many(
        self, calls: Iterable[CallKey], parents: Mapping[CallKey, Context] | None = None
    ) -> dict[CallKey, S | None]:
        """Run every named call (``(tenant, tool_call_id)``) that is still
        ``authorized``: one claim transaction, the requests concurrently, one record
        transaction. Calls that were not claimed (duplicates, already claimed or
        recorded) are absent from the result. ``parents``: the trace context each
        call's provider requests start in (its command's span)."""
        claims = await self.claim_many(calls)
        if not claims:
            return {}
        return await self.run_many(claims, parents)

    async def claim(self, tool_call_id: str, tenant: str) -> Claim | None:
        """Point A for one call: ``authorized -> dispatching`` under this worker's
        lease, committed; None when the call is not ``authorized``."""
        claims = await self.claim_many([(tenant, tool_call_id)])
        return claims[0] if claims else None

    async def claim_many(self, calls: Iterable[CallKey]) -> list[Claim]:
        """Point A for a batch, in one committed transaction. A call that is not
        ``authorized``, or whose capability is not registered, is left alone."""
        moves = [BulkMove(call, tenant=tenant) for tenant, call in dict.fromkeys(calls)]
        if not moves:
            return []
        # A batch larger than the requests in flight is sent in rounds, each as long
        # as one call's worst case at most: its leases cover all of them, so a call
        # waiting its turn is not handed to the recovery sweep meanwhile.
        rounds = self._rounds(len(moves))
        async with self._sessions() as session, session.begin():
            return await claim_calls(
                session,
                moves,
                capabilities=self._capabilities,
                leases={cap: seconds * rounds for cap, seconds in self._leases.items()},
                owner=self.worker_id,
                producer=self._producer,
                topics=self._topics,
            )

    async def claim_in(
        self,
        session: AsyncSession,
        tool_call_id: str,
        capability: Capability,
        *,
        tenant: str,
        expected: S,
        dispatch_attempts: int,
        event_type: EventType = EventType.TOOL_CALL_DISPATCHING,
        payload: dict[str, Any] | None = None,
        fence: Fence | None = None,
        settles: bool = False,
    ) -> Claim:
        """Move ``expected -> dispatching`` under this worker's lease in the caller's
        transaction (the caller's commit is point A), unless ``fence`` no longer holds;
        ``dispatch_attempts`` is the count the caller saw. Raises
        :class:`TransitionConflict`."""
        fence = fence or Fence()
        claims = await claim_calls(
            session,
            [
                BulkMove(
                    tool_call_id,
                    fence.version,
                    {"dispatch_attempts": dispatch_attempts + 1},
                    payload or {},
                    tenant=tenant,
                )
            ],
            capabilities={capability.id: capability},
            leases={capability.id: self.lease_of(capability)},
            owner=self.worker_id,
            producer=self._producer,
            topics=self._topics,
            expected=expected,
            event_type=event_type,
            fence_owner=fence.owner,
            settles=settles,
        )
        if not claims:
            raise TransitionConflict(
                f"tool call {tool_call_id!r} is no longer {expected.value}"
                " (or its lease/version changed)",
                toolCallId=tool_call_id,
                target=S.DISPATCHING.value,
            )
        return claims[0]

    async def run(self, claim: Claim) -> S | None:
        """Send a claimed call (its lease committed) and record the outcome."""
        return (await self.run_many([claim])).get(claim.key)

    async def run_many(
        self, claims: Sequence[Claim], parents: Mapping[CallKey, Context] | None = None
    ) -> dict[CallKey, S | None]:
        """Send claimed calls (their leases committed) concurrently, then record every
        outcome in one transaction. None: not sent (lease lapsed) or not recorded
        (lease lost)."""
        self._crash.hit("after-claim")
        parents = parents or {}
        outcomes = await asyncio.gather(
            *(self._send_in_turn(claim, parents.get(claim.key)) for claim in claims)
        )
        self._crash.hit("after-send")
        statuses: dict[CallKey, S | None] = {
            c.key: None for c, o in zip(claims, outcomes, strict=True) if o is None
        }
        sent = [Sent(c, o) for c, o in zip(claims, outcomes, strict=True) if o is not None]
        statuses.update(await self.record_many(sent))
        self._crash.hit("after-record")
        return statuses

    async def _send_in_turn(self, claim: Claim, parent: Context | None) -> ProviderOutcome | None:
        """:meth:`_send` once a request slot is free, unless the call's lease lapsed
        meanwhile (None: not sent)."""
        async with self._slots or contextlib.nullcontext():
            if time.monotonic() - claim.claimed_at > claim.lease_seconds:
                # Stalled before sending: the recovery sweep owns the call now.
                log.warning("lease of %s lapsed before sending; not sending", claim.tool_call_id)
                return None
            return await self._send(claim, parent)

    async def _send(self, claim: Claim, parent: Context | None = None) -> ProviderOutcome:
        """One call's outcome, whatever goes wrong with it: an error of one call must
        not discard the outcomes of the others in its batch (they are recorded
        together). Timed and counted per capability, whatever the outcome; sent in
        the call's trace when this process exports one. Its own task (gathered), so its
        log context is this call's alone."""
        started = time.monotonic()
        with log_context(
            tool_call_id=claim.tool_call_id,
            run_id=claim.context.run_id,
            capability_id=claim.capability.id,
        ):
            if telemetry.enabled():
                with spans.sending(claim, parent):
                    outcome = await self._dispatch(claim)
            else:
                outcome = await self._dispatch(claim)
        capability = claim.capability.id
        DISPATCH_SECONDS.labels(capability).observe(time.monotonic() - started)
        DISPATCH_OUTCOMES.labels(capability, outcome.kind.value).inc()
        return outcome

    async def _dispatch(self, claim: Claim) -> ProviderOutcome:
        try:
            return await self._provider.dispatch(
                claim.capability,
                DispatchRequest(
                    claim.tool_call_id,
                    claim.provider_key,
                    claim.input,
                    trace_seed=claim.correlation_id or claim.tool_call_id,
                    traceparent=claim.traceparent,
                    tenant=claim.tenant,
                    probe=claim.probe,
                    claimed_at=claim.claimed_at,
                ),
            )
        except Exception as exc:
            # The client answers every error it knows (not sendable: failed). One it
            # does not know cannot prove the request never left: the reconciler asks.
            log.exception("sending %s failed unexpectedly", claim.tool_call_id)
            return ProviderOutcome(
                OutcomeKind.UNKNOWN, 1, error=f"send failed: {type(exc).__name__}"
            )

    async def record(self, claim: Claim, outcome: ProviderOutcome) -> S | None:
        """Point B for one call; None when its lease was lost."""
        return (await self.record_many([Sent(claim, outcome)])).get(claim.key)

    async def record_many(self, sent: Sequence[Sent]) -> dict[CallKey, S | None]:
        """Point B: the outcomes, their events and outbox rows, in one transaction,
        each call fenced by its claim."""
        if not sent:
            return {}
        async with self._sessions() as session, session.begin():
            recorded = await self._recorder.record(session, sent)
        statuses: dict[CallKey, S | None] = {}
        for item in sent:
            call = item.claim.key
            statuses[call] = recorded.get(call)
            if call not in recorded:
                # Fenced out: our lease lapsed and the recovery sweep (or another
                # worker) took the call over. What we saw is not recorded; the
                # reconciler asks the provider, which holds the truth under the same
                # idempotency key.
                log.warning("outcome of %s not recorded: lease lost", call)
                FENCED_OUTCOMES.labels(item.claim.capability.id).inc()
        return statuses
