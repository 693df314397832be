"""A worker's side of the circuit breakers: the gate its provider client asks before
every attempt, and the loop step that sends a half-open breaker's probes.

The breakers' state is the database's (:mod:`dispatcher.ledger.breakers`): every failed
attempt is counted there at once, so N workers agree on when to open. What a worker
keeps is which breakers it last saw open: the failure count's answer, and a read of the
few breakers that are not closed at every step of its loop. A stale view costs little
either way: a breaker seen open too long holds a call back in ``authorized`` (sent
again when the pause lifts, or at once if it lifted already), and one seen closed too
long lets one more attempt fail (counted). The claim itself honours the breaker's
pause, so no call is claimed for a capability whose breaker opened before the claim.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import BreakerPolicy, Capability, CapabilityRegistry, FailureClass
from dispatcher.db.tables import tool_calls
from dispatcher.ledger import breakers as ledger
from dispatcher.ledger.pauses import after_resume
from dispatcher.ledger.transitions import BulkMove
from dispatcher.metrics import BREAKER_FAILURES
from dispatcher.settings import Topics
from dispatcher.states import BreakerState
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.claims import Claim, claim_calls
from dispatcher.worker.executor import Executor

log = logging.getLogger(__name__)


class Breakers:
    """The gate of one worker process (:class:`dispatcher.provider.client.AttemptGate`)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        registry: CapabilityRegistry,
        *,
        topics: Topics,
    ) -> None:
        self._sessions = sessions
        self._topics = topics
        self._policies: Mapping[str, BreakerPolicy] = {
            c.id: c.breaker for c in registry if c.breaker is not None
        }
        self._capabilities = {c.id: c for c in registry if c.breaker is not None}
        # When (time.monotonic()) this process learned each breaker was open.
        self._open: dict[str, float] = {}
        self._half_open: set[str] = set()

    def allows(self, capability: Capability, *, probe: bool, claimed_at: float) -> bool:
        """Every attempt while the breaker is closed; a probe's while it is half-open
        (a failed probe opens it: the probe's next attempt is held). A call claimed
        after this process learned the breaker was open found its pause lifted: the
        breaker closed since (the view here is stale), so it goes."""
        seen = self._open.get(capability.id)
        if seen is None:
            return True
        if probe:
            return capability.id in self._half_open
        return claimed_at > seen

    async def failed(self, capability: Capability, failure: FailureClass) -> None:
        """Count a failed attempt; never raises (a send must not fail for it)."""
        policy = capability.breaker
        if policy is None or failure not in policy.counts:
            return
        BREAKER_FAILURES.labels(capability.id, failure).inc()
        try:
            async with self._sessions() as session, session.begin():
                breaker = await ledger.count_failure(
                    session, capability.id, policy, failure, topics=self._topics
                )
        except Exception:
            log.exception("failure of %s not counted by its breaker", capability.id)
            return
        if breaker.state is BreakerState.OPEN:
            if capability.id not in self._open or capability.id in self._half_open:
                log.warning("circuit breaker of %s is open", capability.id)
            # Learned now (again): calls claimed before now are held.
            self._open[capability.id] = time.monotonic()
            self._half_open.discard(capability.id)

    async def step(self, executor: Executor) -> None:
        """One loop step: half-open the breakers whose cool-down ended, send the probes
        they allow, close a breaker whose probe the provider answered, and refresh
        which breakers this worker holds calls for."""
        if not self._policies:
            return
        async with self._sessions() as session, session.begin():
            for armed in await ledger.arm_probes(session, self._policies):
                log.info("circuit breaker of %s is half-open", armed.capability_id)
            seen = await ledger.not_closed(session)
        now = time.monotonic()
        self._open = {c: self._open.get(c, now) for c in seen if c in self._policies}
        self._half_open = {c for c, b in seen.items() if b.state is BreakerState.HALF_OPEN}
        for capability_id, breaker in seen.items():
            if breaker.state is BreakerState.HALF_OPEN and breaker.probes_left > 0:
                await self._probe(executor, capability_id)

    async def _probe(self, executor: Executor, capability_id: str) -> None:
        claims = await self._claim_probes(executor, capability_id)
        if not claims:
            return
        statuses = await executor.run_many(claims)
        # Answered by the provider: anything but held back or lost. A failed probe was
        # counted as it failed, which opened the breaker again (the close then finds
        # it open, and does nothing).
        answered = [s for s in statuses.values() if s is not None and s is not S.AUTHORIZED]
        if not answered:
            return
        async with self._sessions() as session, session.begin():
            closed = await ledger.close(
                session,
                capability_id,
                reason="circuit breaker closed: a probe call was answered",
                topics=self._topics,
            )
        if closed:
            await after_resume(self._sessions, capability_id)
            self._open.pop(capability_id, None)
            log.info("circuit breaker of %s is closed", capability_id)

    async def _claim_probes(self, executor: Executor, capability_id: str) -> list[Claim]:
        """Claim the oldest waiting calls the breaker's probes allow, and spend them, in
        one transaction."""
        capability = self._capabilities[capability_id]
        async with self._sessions() as session, session.begin():
            left = await ledger.probes_left(session, capability_id)
            if left <= 0:
                return []
            waiting = await session.execute(
                select(tool_calls.c.tenant, tool_calls.c.tool_call_id)
                .where(
                    tool_calls.c.status == S.AUTHORIZED.value,
                    tool_calls.c.capability_id == capability_id,
                )
                .order_by(tool_calls.c.updated_at)
                .limit(left)
                .with_for_update(skip_locked=True)
            )
            moves = [BulkMove(r.tool_call_id, tenant=r.tenant) for r in waiting]
            if not moves:
                return []
            claims = await claim_calls(
                session,
                moves,
                capabilities={capability_id: capability},
                leases={capability_id: executor.lease_of(capability)},
                owner=executor.worker_id,
                producer=executor.producer,
                topics=self._topics,
                probe=True,
            )
            await ledger.take_probes(session, capability_id, len(claims))
        log.info("circuit breaker of %s: %d probe call(s)", capability_id, len(claims))
        return claims
