"""A batch larger than the worker's concurrency: its requests go at most that many at a
time, its leases cover every round of them, and a call whose lease lapsed while it
waited for its turn is not sent (real PostgreSQL and a real HTTP provider)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import tool_calls
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Executor
from tests.fixtures.calls import submit_call

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]


class SlowProvider:
    """Answers every POST with a 200 after ``seconds``, counting the requests in
    flight at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.in_flight = 0
        self.most = 0
        self.keys: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.keys.append(request.headers["Idempotency-Key"])
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(self.seconds)
        finally:
            self.in_flight -= 1
        return web.json_response({"id": f"req-{len(self.keys)}", "status": "succeeded"})


@pytest.fixture
async def provider() -> AsyncIterator[tuple[SlowProvider, str]]:
    slow = SlowProvider(0.05)
    app = web.Application()
    app.router.add_post("/v1/requests", slow.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield slow, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
def registry(provider: tuple[SlowProvider, str]) -> CapabilityRegistry:
    return registry_of(capability("refund", provider[1], lookup=False))


def executor(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport, concurrency: int | None
) -> Executor:
    return Executor(
        sessions,
        registry,
        ProviderClient(http),
        worker_id="worker-rounds",
        topics=DEFAULT_TOPICS,
        concurrency=concurrency,
    )


async def submit(sessions: Sessions, registry: CapabilityRegistry, n: int) -> list[str]:
    return [
        await submit_call(sessions, registry, "refund", {"n": i}, key=f"k-{i}") for i in range(n)
    ]


async def lease_lengths(sessions: Sessions, calls: list[str]) -> list[float]:
    async with sessions() as session:
        rows = await session.execute(
            select(tool_calls.c.lease_expires_at - tool_calls.c.dispatched_at).where(
                tool_calls.c.tool_call_id.in_(calls)
            )
        )
        return [interval.total_seconds() for (interval,) in rows]


async def test_a_batch_goes_out_at_most_concurrency_requests_at_a_time(
    sessions: Sessions, registry: CapabilityRegistry, provider: tuple[SlowProvider, str]
) -> None:
    slow, _ = provider
    calls = await submit(sessions, registry, 10)
    async with Transport(16) as http:
        statuses = await executor(sessions, registry, http, 3).execute_many(
            ("acme", c) for c in calls
        )
    assert list(statuses.values()) == [S.COMPLETED] * 10
    assert (slow.most, len(slow.keys)) == (3, 10)


async def test_the_leases_of_a_batch_cover_every_round_of_its_requests(
    sessions: Sessions, registry: CapabilityRegistry, provider: tuple[SlowProvider, str]
) -> None:
    calls = await submit(sessions, registry, 10)
    async with Transport(16) as http:
        rounds = executor(sessions, registry, http, 3)
        one = rounds._leases["refund"]
        claims = await rounds.claim_many(("acme", c) for c in calls[:7])
        # 7 calls, 3 at a time: 3 rounds; a batch that fits in one round keeps one lease.
        assert {c.lease_seconds for c in claims} == {3 * one}
        assert await lease_lengths(sessions, calls[:7]) == pytest.approx([3 * one] * 7, abs=0.5)
        single = await rounds.claim_many(("acme", c) for c in calls[7:])
        assert {c.lease_seconds for c in single} == {one}
        unbounded = executor(sessions, registry, http, None)
        assert unbounded._leases["refund"] == one
        # The consumer's poll interval covers the longest batch.
        assert rounds.longest_batch_seconds(7) == 3 * one
        assert unbounded.longest_batch_seconds(7) == one


async def test_a_call_whose_lease_lapsed_while_it_waited_its_turn_is_not_sent(
    sessions: Sessions, registry: CapabilityRegistry, provider: tuple[SlowProvider, str]
) -> None:
    """Checked when its turn comes, not when the batch starts: the second call's lease
    is still live when the batch starts, and lapses while the first is answered."""
    slow, _ = provider
    first, second = await submit(sessions, registry, 2)
    async with Transport(4) as http:
        worker = executor(sessions, registry, http, 1)
        a, b = sorted(
            await worker.claim_many([("acme", first), ("acme", second)]),
            key=lambda c: c.tool_call_id == second,
        )
        nearly = dataclasses.replace(b, claimed_at=b.claimed_at - b.lease_seconds + 0.02)
        statuses = await worker.run_many([a, nearly])
    assert statuses == {("acme", first): S.COMPLETED, ("acme", second): None}
    assert len(slow.keys) == 1
