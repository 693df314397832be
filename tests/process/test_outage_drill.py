"""The day a provider goes down, as a drill on the service's own processes (the API, two
workers, the relay and the reconciler): calls of a capability with a circuit breaker
keep arriving while its provider refuses connections. No call ends ``failed``; the
attempts that fail are the breaker's threshold and its failed probes, no more; after
the provider comes back every call completes with one effect. (A request the outage
cut after it was sent is in doubt: the reconciler asks the provider by its key and
confirms it.)

Each worker sends one request at a time (``worker_concurrency`` 1), so a worker's
failure is counted before its next attempt starts: past the threshold, only the
requests the other workers had in flight when the breaker opened may fail too, one
each. With N requests in flight at once, up to N may (``bench.outage`` measures it at
50 calls/s)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.chaos.proxy import TcpProxy
from devtools.embedded import free_port
from devtools.sandbox import SandboxServer
from dispatcher.settings import hash_api_key
from tests.fixtures.sandbox import at_provider, books
from tests.fixtures.stack import MakeStack, ProcessStack
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow, pytest.mark.process]

Sessions = async_sessionmaker[AsyncSession]
KEY = "tdk_outage_acme"
THRESHOLD = 4
BREAKER = {"threshold": THRESHOLD, "windowSeconds": 30, "coolDownSeconds": 1, "probes": 1}
RATE, SECONDS, DOWN_AT, DOWN_FOR = 20, 8.0, 1.5, 4.0
WORKERS = 2

# Every attempt but a success's last one failed: the provider was down for each.
FAILED_ATTEMPTS = text("""
SELECT coalesce(sum(CASE WHEN event_type IN ('tool.call.completed', 'tool.call.accepted')
                         THEN (payload->>'attempts')::int - 1
                         ELSE (payload->>'attempts')::int END), 0)
FROM execution_events
WHERE payload ? 'attempts' AND payload->'from' ? 'dispatching'
""")
DONE = {"completed", "confirmed"}
# What a call that did not finish went through, beside the capability's facts.
UNFINISHED = text("""
SELECT e.occurred_at, e.event_type::text, e.payload::text FROM execution_events e
JOIN tool_calls c USING (tenant, tool_call_id) WHERE c.status NOT IN ('completed', 'confirmed')
UNION ALL
SELECT o.created_at, 'outbox: ' || (o.headers ->> 'ce_type'), coalesce(o.published_at::text, '')
FROM outbox o JOIN tool_calls c ON o.key = c.tenant || '/' || c.tool_call_id
WHERE c.status NOT IN ('completed', 'confirmed')
UNION ALL
SELECT occurred_at, event_type::text, reason FROM capability_events
UNION ALL
SELECT changed_at, 'capability: ' || status, coalesce(resumed_at::text, '') FROM capability_states
ORDER BY 1
""")
FAILED_PROBES = text(
    "SELECT count(*) FROM capability_events"
    " WHERE event_type = 'capability.breaker_opened' AND reason LIKE '%probe%'"
)


@pytest.fixture
async def proxy(sandbox: SandboxServer) -> AsyncIterator[TcpProxy]:
    upstream = httpx.URL(sandbox.url)
    found = TcpProxy(upstream.host, upstream.port or 80)
    await found.start()
    yield found
    await found.stop()


@pytest.fixture
def stack(make_stack: MakeStack, proxy: TcpProxy) -> ProcessStack:
    keys = [{"sha256": hash_api_key(KEY), "tenant": "acme", "scopes": ["submit", "read"]}]
    return make_stack(
        sandbox_url=f"http://127.0.0.1:{proxy.port}",
        # The outage refuses connections, so no attempt against it waits for this; a
        # provider slow to answer on a loaded machine after it is back would otherwise
        # time out and count as a failed attempt the outage did not cause.
        capability={"attempts": 3, "breaker": BREAKER, "by_key": True, "timeout": 15.0},
        http_port=free_port(),
        api_keys=json.dumps(keys),
        worker_concurrency=1,
        recovery_interval_seconds=0.5,
        reconcile_interval_seconds=0.5,
    )


async def refuse_for(proxy: TcpProxy, seconds: float) -> None:
    """Nothing listens (connections refused), then the same port listens again."""
    proxy._requested_port = proxy.port
    await proxy.stop()
    await asyncio.sleep(seconds)
    await proxy.start()


async def test_a_provider_outage_fails_no_call_and_reaches_it_at_most_threshold_plus_probes(
    stack: ProcessStack, sessions: Sessions, sandbox: SandboxServer, proxy: TcpProxy
) -> None:
    api = stack.start("serve")
    workers = [stack.start("worker", name=f"worker-{n}") for n in range(WORKERS)]
    stack.start("relay")
    stack.start("reconcile")
    port = stack.env["TOOL_DISPATCHER_HTTP_PORT"]
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    ) as client:  # fmt: skip

        async def up() -> bool:
            assert api.poll() is None, stack.log_of(api)
            try:
                return (await client.get("/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(up, what="the API to be ready")
        keys = [f"outage-{n}" for n in range(round(RATE * SECONDS))]
        outage = asyncio.get_running_loop().call_later(
            DOWN_AT, lambda: asyncio.ensure_future(refuse_for(proxy, DOWN_FOR))
        )
        for key in keys:
            body = {"runId": "r", "capabilityId": "refund", "idempotencyKey": key, "input": {}}
            reply = await client.post("/v1/tool-calls", json=body)
            assert reply.status_code == 201, reply.text
            await asyncio.sleep(1 / RATE)
        outage.cancel()

    last: dict[str, int] = {}

    async def settled() -> bool:
        async with sessions() as session:
            rows = await session.execute(text("SELECT status, count(*) FROM tool_calls GROUP BY 1"))
            found = {status: n for status, n in rows}
        assert not {"failed", "escalated"} & set(found), found
        last.clear()
        last.update(found)
        return set(found) <= DONE and sum(found.values()) == len(keys)

    try:
        await eventually(settled, within=60, what="every call to complete after the outage")
    except AssertionError:
        logs = "\n".join(stack.log_of(p)[-2500:] for p in workers)
        async with sessions() as session:
            unfinished = (await session.execute(UNFINISHED)).all()
        logs = "\n".join(map(str, unfinished)) + "\n" + logs
        raise AssertionError(f"{last}: {logs}") from None
    async with sessions() as session:
        failed_attempts = (await session.execute(FAILED_ATTEMPTS)).scalar_one()
        failed_probes = (await session.execute(FAILED_PROBES)).scalar_one()
        opened = (
            await session.execute(
                text("SELECT count(*) FROM capability_events WHERE event_type = :t"),
                {"t": "capability.breaker_opened"},
            )
        ).scalar_one()
        failing = (
            await session.execute(
                text(
                    "SELECT occurred_at, event_type::text, payload->>'attempts',"
                    " payload->>'worker', payload->>'error', tool_call_id FROM execution_events"
                    " WHERE payload ? 'attempts' AND payload->'from' ? 'dispatching'"
                    " AND (payload->>'attempts')::int > 1 OR event_type <> 'tool.call.completed'"
                    " AND payload ? 'attempts' UNION ALL SELECT occurred_at, event_type, reason,"
                    " NULL, NULL, NULL FROM capability_events ORDER BY 1"
                )
            )
        ).all()
    assert opened >= 1, "the outage never opened the breaker"
    # In flight elsewhere when it opened: one request of each other worker at most.
    in_flight = WORKERS - 1
    assert 0 < failed_attempts <= THRESHOLD + failed_probes + in_flight, "\n".join(
        map(str, failing)
    )
    provider = await books(sandbox.url)
    assert [provider["effects"].get(at_provider(k)) for k in keys] == [1] * len(keys)
