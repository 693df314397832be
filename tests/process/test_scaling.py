"""The production overlay's scaling claim, run on one machine as the overlay lays it out:
3 API processes, 3 relays, 4 workers and 2 overlapping ``reconcile --once`` runs (the
CronJob whose runs overlap when one outlasts its schedule), 2,000 calls through them.

Every call ends settled exactly once (``completed``, or ``confirmed`` by one of the two
reconcilers after its answer was dropped) with exactly one effect at the sandbox, and
each run's facts reach the events topic in the order they were recorded (per-key
order with three relays leasing the lanes). Load balancing is the test's: it spreads
the calls over the three APIs, as a Service would."""

from __future__ import annotations

import asyncio
from collections import Counter
from functools import partial
from itertools import cycle
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.embedded import free_port, wait_for_port
from devtools.registries import capability, registry_of
from dispatcher.db.tables import execution_events, tool_calls
from dispatcher.ledger.events import LOG_ONLY
from tests.fixtures.capabilities import registry_file
from tests.fixtures.relay import TopicReader
from tests.fixtures.sandbox import add_fault, at_provider, books
from tests.fixtures.stack import API_KEY, MakeStack, ProcessStack, exited
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]

CALLS = 2000
APIS, RELAYS, WORKERS = 3, 3, 4
DROPPED = range(0, CALLS, 20)  # 5%: applied, the answer lost; a reconciler confirms it
SETTLED = {"completed", "confirmed"}


def key(i: int) -> str:
    return f"refund:scale-{i}"


@pytest.fixture
def sandbox_port() -> int:
    return free_port()


@pytest.fixture
def stack(make_stack: MakeStack, sandbox_port: int) -> ProcessStack:
    sandbox_url = f"http://127.0.0.1:{sandbox_port}"
    # A partition or more per worker (the overlay's rule: workers <= partitions).
    stack = make_stack(sandbox_url=sandbox_url, topic_partitions=8)
    # Looked up by key: a dropped answer names no request id. A timeout no loaded
    # machine comes near, so only the dropped answers end in doubt.
    refund = capability("refund", sandbox_url, by_key=True, reconcile={}, timeout=10.0, attempts=3)
    stack.env["TOOL_DISPATCHER_CAPABILITIES_FILE"] = str(
        registry_file(stack.tmp, registry_of(refund))
    )
    stack.start("sandbox", "--port", str(sandbox_port), "--ops-port", "0")
    wait_for_port("127.0.0.1", sandbox_port, timeout=60)
    return stack


async def _statuses(sessions: async_sessionmaker[AsyncSession]) -> Counter[str]:
    async with sessions() as session:
        rows = await session.execute(
            select(tool_calls.c.status, func.count()).group_by(tool_calls.c.status)
        )
        return Counter({status: n for status, n in rows})


async def _at_least(sessions: async_sessionmaker[AsyncSession], n: int, *of: str) -> bool:
    counts = await _statuses(sessions)
    return sum(counts[s] for s in of) >= n


async def _post(i: int, client: httpx.AsyncClient) -> int:
    response = await client.post(
        "/v1/tool-calls",
        json={
            # A run per call: each run's facts are one causal chain, whose order on
            # the events topic is the order they were recorded in.
            "runId": f"run-{i}",
            "capabilityId": "refund",
            "idempotencyKey": key(i),
            "input": {"orderId": f"order-{i}"},
        },
    )
    return response.status_code


async def _submit_all(ports: list[int]) -> Counter[int]:
    clients = [
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            timeout=30,
            headers={"Authorization": f"Bearer {API_KEY}"},
        )
        for port in ports
    ]
    limit = asyncio.Semaphore(48)

    async def submit(i: int, client: httpx.AsyncClient) -> int:
        async with limit:
            for attempt in range(3):
                try:
                    return await _post(i, client)
                except httpx.TransportError:
                    # A keep-alive connection the server closed as the request went
                    # out: sent again under the same key, as intake's replay promises.
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

    try:
        spread = zip(range(CALLS), cycle(clients), strict=False)
        return Counter(await asyncio.gather(*(submit(i, c) for i, c in spread)))
    finally:
        for client in clients:
            await client.aclose()


async def _assert_run_order(
    stack: ProcessStack, sessions: async_sessionmaker[AsyncSession], bootstrap: str
) -> None:
    """Each run's first deliveries, in partition order, have rising ``seq``: every event
    published (all but the log-only ones, ``LOG_ONLY``)."""
    async with sessions() as session:
        rows = await session.execute(
            select(execution_events.c.event_id, execution_events.c.seq).where(
                execution_events.c.event_type.not_in(sorted(LOG_ONLY))
            )
        )
        seq = {event_id: s for event_id, s in rows}
    async with TopicReader(bootstrap, stack.topics["events"]) as reader:
        await reader.until(lambda got: len({m.value["eventId"] for m in got}) >= len(seq), 120)
        messages = reader.messages
    seen: set[str] = set()
    last: dict[str, int] = {}
    for m in sorted(messages, key=lambda m: (m.partition, m.offset)):
        event_id = m.value["eventId"]
        if event_id in seen:  # a re-publish (at least once): order is of first deliveries
            continue
        seen.add(event_id)
        assert seq[event_id] > last.get(m.key, -1), f"run {m.key}: {event_id} out of order"
        last[m.key] = seq[event_id]
    assert seen == set(seq)


async def test_three_apis_three_relays_four_workers_two_reconcilers(
    stack: ProcessStack,
    sessions: async_sessionmaker[AsyncSession],
    sandbox_port: int,
    kafka_bootstrap: str,
) -> None:
    sandbox_url = f"http://127.0.0.1:{sandbox_port}"
    # The send only (a lookup by key carries the key too), and once.
    rules: list[dict[str, Any]] = [
        {
            "kind": "drop_after_apply",
            "idempotencyKey": at_provider(key(i)),
            "method": "POST",
            "times": 1,
        }
        for i in DROPPED
    ]
    await add_fault(sandbox_url, rules)

    ports = [free_port() for _ in range(APIS)]
    apis = [
        stack.start("serve", name=f"api-{n}", http_port=str(port)) for n, port in enumerate(ports)
    ]
    for port in ports:
        await asyncio.to_thread(wait_for_port, "127.0.0.1", port, timeout=60)
    # Ops ports off: several processes of one kind on one host would collide.
    for n in range(RELAYS):
        stack.start("relay", name=f"relay-{n}", ops_port="0")
    for n in range(WORKERS):
        stack.start("worker", name=f"worker-{n}", ops_port="0")

    codes = await _submit_all(ports)
    # 201, or 200 for a replay of a request whose first answer was lost on the way.
    assert set(codes) <= {200, 201} and codes.total() == CALLS, codes
    assert all(api.poll() is None for api in apis)
    await eventually(
        partial(_at_least, sessions, CALLS, *SETTLED, "result_unknown"),
        within=240,
        what="every call to be dispatched",
    )

    # The cron job's runs overlapping: each call in doubt is settled by exactly one.
    runs = [stack.start("reconcile", "--once", name=f"cron-{n}", ops_port="0") for n in (0, 1)]
    assert [await exited(run, within=120) for run in runs] == [0, 0]

    final = await _statuses(sessions)
    assert final == {"completed": CALLS - len(DROPPED), "confirmed": len(DROPPED)}, final
    counts = await books(sandbox_url)
    assert counts["effects"] == {at_provider(key(i)): 1 for i in range(CALLS)}
    async with sessions() as session:
        settled = await session.execute(
            select(execution_events.c.tool_call_id, func.count())
            .where(execution_events.c.event_type == "tool.call.confirmed")
            .group_by(execution_events.c.tool_call_id)
        )
        reconciled = dict(settled.all())
    assert len(reconciled) == len(DROPPED)
    assert set(reconciled.values()) == {1}  # never settled twice
    await _assert_run_order(stack, sessions, kafka_bootstrap)
