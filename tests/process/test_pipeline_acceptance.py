"""The pipeline's acceptance run: 1,000 calls through API -> relay -> workers -> sandbox with
10% dropped responses, 5% 503s and two worker kill -9s, all as real processes."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from functools import partial
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.embedded import free_port, wait_for_port
from dispatcher.db.tables import tool_calls
from tests.fixtures.sandbox import add_fault, at_provider, books
from tests.fixtures.stack import API_KEY, MakeStack, ProcessStack, exited
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]

CALLS = 1000
DROPPED = range(100)  # 10%: the effect happens, the response is lost
THROTTLED = range(100, 125)  # 2.5%: 503 with Retry-After, nothing applied
FAILED_5XX = range(125, 150)  # 2.5%: 503 without Retry-After, no definitive answer
SETTLED_OR_UNKNOWN = {"completed", "failed", "result_unknown"}


@pytest.fixture
def sandbox_port() -> int:
    return free_port()


@pytest.fixture
def stack(make_stack: MakeStack, sandbox_port: int) -> ProcessStack:
    stack = make_stack(
        sandbox_url=f"http://127.0.0.1:{sandbox_port}",
        # Only a stalled provider ever waits for this (the faults below answer or drop
        # at once); a read timeout would make a call result_unknown that the fault plan
        # says completes. The lease it gives (3 x 10 s + backoff + margin, about 31 s)
        # is how long a killed worker's calls wait for the recovery sweep.
        capability={"timeout": 10.0, "attempts": 3},
        # A batch no larger than the requests in flight keeps that one lease: a batch
        # of 500 at 64 at a time would take eight (TOOL_DISPATCHER_WORKER_BATCH_SIZE).
        worker_batch_size=64,
        http_port=free_port(),
    )
    # The provider as a process of its own, like the rest of the pipeline: not in this
    # test's event loop, which submits and polls at the same time.
    stack.start("sandbox", "--port", str(sandbox_port))
    wait_for_port("127.0.0.1", sandbox_port, timeout=60)
    return stack


def key(i: int) -> str:
    return f"refund:order-{i}"


def sent(i: int) -> str:
    """The key the sandbox receives for call ``i`` (submitted as acme)."""
    return at_provider(key(i))


async def statuses(sessions: async_sessionmaker[AsyncSession]) -> Counter[str]:
    async with sessions() as session:
        rows = await session.execute(
            select(tool_calls.c.status, func.count()).group_by(tool_calls.c.status)
        )
        return Counter({status: n for status, n in rows})


async def test_thousand_calls_with_lost_responses_503s_and_worker_kills(
    stack: ProcessStack,
    sessions: async_sessionmaker[AsyncSession],
    sandbox_port: int,
) -> None:
    sandbox_url = f"http://127.0.0.1:{sandbox_port}"
    rules: list[dict[str, Any]] = [
        {"kind": "drop_after_apply", "idempotencyKey": sent(i)} for i in DROPPED
    ]
    rules += [
        {"kind": "unavailable", "retryAfter": 0, "times": 1, "idempotencyKey": sent(i)}
        for i in THROTTLED
    ]
    rules += [{"kind": "error", "status": 503, "idempotencyKey": sent(i)} for i in FAILED_5XX]
    await add_fault(sandbox_url, rules)

    api = stack.start("serve")
    api_port = int(stack.env["TOOL_DISPATCHER_HTTP_PORT"])
    await asyncio.to_thread(wait_for_port, "127.0.0.1", api_port, timeout=60)
    stack.start("relay")
    workers = [stack.start("worker", name="worker-a"), stack.start("worker", name="worker-b")]

    base = f"http://127.0.0.1:{stack.env['TOOL_DISPATCHER_HTTP_PORT']}"
    limit = asyncio.Semaphore(32)
    async with httpx.AsyncClient(
        base_url=base, timeout=30, headers={"Authorization": f"Bearer {API_KEY}"}
    ) as client:
        resent: list[int] = []

        async def submit(i: int) -> int:
            body = {
                "runId": f"run-{i % 50}",
                "capabilityId": "refund",
                "idempotencyKey": key(i),
                "input": {"orderId": f"order-{i}"},
            }
            async with limit:
                try:
                    return (await client.post("/v1/tool-calls", json=body)).status_code
                except httpx.TransportError:
                    # What a producer does with a lost answer (a keep-alive connection
                    # the server closed as it was reused, on a loaded machine): send
                    # the same request again; the key replays it if it was recorded.
                    resent.append(i)
                    return (await client.post("/v1/tool-calls", json=body)).status_code

        codes = await asyncio.gather(*(submit(i) for i in range(CALLS)))
    # 201 created; 200 only for a request sent again after its answer was lost.
    assert set(codes) <= {200, 201}, Counter(codes)
    replayed = {i for i, code in enumerate(codes) if code == 200}
    assert replayed <= set(resent), sorted(replayed - set(resent))
    assert api.poll() is None

    async def done_at_least(n: int) -> bool:
        counts = await statuses(sessions)
        return sum(counts[s] for s in SETTLED_OR_UNKNOWN) >= n

    for victim, progress in ((0, 300), (1, 600)):
        await eventually(
            partial(done_at_least, progress), within=120, what=f"{progress} calls done"
        )
        workers[victim].send_signal(signal.SIGKILL)
        assert await exited(workers[victim]) == -signal.SIGKILL
        workers[victim] = stack.start("worker", name=f"restarted-{victim}")

    await eventually(partial(done_at_least, CALLS), within=180, what="every call to settle")

    final = await statuses(sessions)
    assert set(final) <= SETTLED_OR_UNKNOWN, final
    assert sum(final.values()) == CALLS
    counts = await books(sandbox_url)
    assert max(counts["effects"].values()) == 1  # no effect ever happened twice
    async with sessions() as session:
        rows = (
            await session.execute(
                select(tool_calls.c.idempotency_key, tool_calls.c.status, tool_calls.c.last_error)
            )
        ).all()
    status = {k: st for k, st, _ in rows}
    # Calls a killed worker had claimed: honest unknowns, whatever their fault plan was.
    orphaned = {k for k, st, err in rows if st == "result_unknown" and "worker_lost" in err}
    assert len(orphaned) <= 2 * 64  # at most what two workers hold in flight
    effects, received = counts["effects"], counts["received"]
    for i in DROPPED:
        assert status[key(i)] == "result_unknown"
        # The lost answer's effect is real, unless the worker died before sending.
        assert effects.get(sent(i), 0) == min(received.get(sent(i), 0), 1)
    for i in THROTTLED:
        if key(i) not in orphaned:
            assert status[key(i)] == "completed"
            assert received[sent(i)] == 2  # refused once, then sent again
    for i in FAILED_5XX:
        assert status[key(i)] == "result_unknown"
        assert received.get(sent(i), 0) <= 1  # never retried blindly
        assert sent(i) not in effects
    completed = [k for k, st in status.items() if st == "completed"]
    assert all(effects.get(at_provider(k)) == 1 for k in completed)
    assert final["completed"] >= CALLS - len(DROPPED) - len(FAILED_5XX) - len(orphaned)
