"""Many transactions move calls of the same few runs at once, from many sessions: every
summary row is then contended. None of them deadlocks, and every count is exact.

The mix: intake statements into the runs, worker-style claims (one statement over
several runs), single moves, transactions of several moves over runs in a random order
(counted at their end, :func:`dispatcher.ledger.summaries.deferred`), crash-recovery
sweeps (the real one: a move per call, in lease order), a stop and a recount of every
run, each transaction holding its locks a little while before it commits."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control import runs
from dispatcher.control.actor import Actor
from dispatcher.db.engine import engine_for, session_factory
from dispatcher.db.tables import tool_calls
from dispatcher.errors import TransitionConflict
from dispatcher.intake.service import submit_many
from dispatcher.ledger import summaries
from dispatcher.ledger.events import EventType
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.transitions import BulkMove, move, move_many
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.recovery import recover_expired
from tests.fixtures.summaries import assert_summaries_exact

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
RUNS = [f"run-{n}" for n in range(4)]
CALLS_PER_RUN = 60
HOLD = 0.005
"""How long a transaction keeps its locks between its writes and before it commits."""


@pytest.fixture
async def many(database_url: str) -> AsyncIterator[Sessions]:
    """Sessions enough for every task to hold a transaction at once."""
    engine = engine_for(database_url, pool_size=24)
    yield session_factory(engine)
    await engine.dispose()


async def _submit(sessions: Sessions, registry: CapabilityRegistry, n: int, seed: int) -> None:
    rng = random.Random(seed)
    items = [
        (
            SubmitRequest(
                run_id=rng.choice(RUNS),
                capability_id="send-email",
                input={"to": "a@example.com", "subject": "s", "orderId": f"o-{seed}-{i}"},
            ),
            "acme",
        )
        for i in range(n)
    ]
    async with sessions() as session, session.begin():
        await submit_many(session, items, registry=registry)
        await asyncio.sleep(HOLD)


async def _ids(sessions: Sessions, status: S) -> list[str]:
    async with sessions() as session:
        rows = await session.execute(
            select(tool_calls.c.tool_call_id).where(tool_calls.c.status == status.value)
        )
        return list(rows.scalars())


async def _claims(sessions: Sessions, seed: int) -> None:
    """A worker's claims: a batch over several runs in one statement, its lease
    already lapsed (so that recovery finds it)."""
    rng = random.Random(seed)
    for _ in range(8):
        waiting = await _ids(sessions, S.AUTHORIZED)
        batch = rng.sample(waiting, min(10, len(waiting)))
        async with sessions() as session, session.begin():
            await move_many(
                session,
                [BulkMove(c, tenant="acme") for c in batch],
                expected=S.AUTHORIZED,
                target=S.DISPATCHING,
                event_type=EventType.TOOL_CALL_DISPATCHING,
                producer=Producer.WORKER,
                lease_owner=None,
                fields={
                    "lease_owner": f"w-{seed}",
                    "lease_expires_at": func.now() - text(f"interval '{rng.randint(1, 99)} ms'"),
                },
            )
            await asyncio.sleep(HOLD)


async def _outcomes(sessions: Sessions, seed: int) -> None:
    """Transactions of several single moves over runs in a random order, counted at
    their end; and single moves, each counted in its own statement."""
    rng = random.Random(seed)
    for round_ in range(8):
        flying = await _flying(sessions)
        # In id order, as every mover takes call rows (ids are random: the runs come in
        # any order).
        picked = sorted(rng.sample(flying, min(5, len(flying))))
        async with sessions() as session, session.begin():
            if round_ % 2:
                async with summaries.deferred(session):
                    await _each(session, picked, rng)
            else:
                await _each(session, picked[:1], rng)


async def _each(session: AsyncSession, calls: list[str], rng: random.Random) -> None:
    for call in calls:
        try:
            await move(
                session,
                call,
                tenant="acme",
                expected=S.DISPATCHING,
                target=rng.choice([S.COMPLETED, S.FAILED, S.ACCEPTED]),
                event_type=EventType.TOOL_CALL_COMPLETED,
                producer=Producer.WORKER,
            )
        except TransitionConflict:
            continue  # another task moved it first
        await asyncio.sleep(HOLD)


async def _flying(sessions: Sessions) -> list[str]:
    """The calls being dispatched, once the claims have committed some."""
    for _ in range(50):
        if flying := await _ids(sessions, S.DISPATCHING):
            return flying
        await asyncio.sleep(0.01)
    return []


async def _recoveries(sessions: Sessions, registry: CapabilityRegistry) -> None:
    for _ in range(6):
        await _flying(sessions)
        await recover_expired(sessions, registry, topics=DEFAULT_TOPICS, limit=7)
        await asyncio.sleep(HOLD)


async def _stop(sessions: Sessions, registry: CapabilityRegistry) -> None:
    await asyncio.sleep(0.05)
    async with sessions() as session, session.begin():
        await runs.stop_run(
            session,
            tenant="acme",
            run_id=RUNS[0],
            actor=Actor("ops", "acme", "test"),
            reason="enough",
            registry=registry,
        )


async def _recount(sessions: Sessions) -> None:
    """Counting every run again while the calls move (as after a rollout)."""
    await asyncio.sleep(0.1)
    async with sessions() as session, session.begin():
        await summaries.recount(session)


async def test_concurrent_moves_of_one_run_neither_deadlock_nor_lose_a_count(
    many: Sessions, registry: CapabilityRegistry
) -> None:
    await _submit(many, registry, CALLS_PER_RUN * len(RUNS), seed=0)
    await asyncio.gather(
        *(_submit(many, registry, 5, seed=s) for s in range(1, 9)),
        *(_claims(many, seed=s) for s in range(6)),
        *(_outcomes(many, seed=s) for s in range(6)),
        *(_recoveries(many, registry) for _ in range(3)),
        _stop(many, registry),
        _recount(many),
    )
    truth = await assert_summaries_exact(many, when="after the concurrent moves")
    moved = {status for counts in truth.values() for status in counts}
    # Moves of many kinds happened, on contended rows.
    assert {"cancelled", "result_unknown"} <= moved and len(moved) >= 4, moved
