"""The worker's metrics move when their facts happen: a dispatch (its duration and
outcome class), a zombie's outcome fenced out, a take-over by the recovery sweep, a
re-drive, and the consumer lag after a fetch. Real PostgreSQL, the real sandbox, a
real broker for the lag; each read through the default registry, as a scrape reads."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client import REGISTRY
from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import outbox, tool_calls
from dispatcher.provider.client import OutcomeKind, ProviderClient, ProviderOutcome
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.consumer import observe_lag
from dispatcher.worker.executor import Executor
from dispatcher.worker.recovery import recover_expired
from dispatcher.worker.redrive import redrive_stale
from tests.fixtures.calls import expire_leases, submit_call
from tests.fixtures.metrics import sample

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("labels_stay_bounded")]

Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(
        capability("refund", sandbox.url), capability("lookup", sandbox.url, side_effects=False)
    )


@pytest.fixture
async def executor(sessions: Sessions, registry: CapabilityRegistry) -> AsyncIterator[Executor]:
    async with Transport() as http:
        yield Executor(
            sessions, registry, ProviderClient(http), worker_id="worker-m", topics=DEFAULT_TOPICS
        )


async def test_a_dispatch_is_timed_and_its_outcome_class_counted(
    sessions: Sessions, registry: CapabilityRegistry, executor: Executor
) -> None:
    count = "tool_dispatcher_dispatch_seconds_count"
    done = "tool_dispatcher_dispatch_outcomes_total"
    completed = {"capability": "refund", "outcome": "completed"}
    before = sample(count, capability="refund"), sample(done, **completed)
    sum_before = sample("tool_dispatcher_dispatch_seconds_sum", capability="refund")
    unknown = sample(done, capability="refund", outcome="unknown")

    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="m-dispatch")
    assert await executor.execute(call, "acme") is S.COMPLETED

    after = sample(count, capability="refund"), sample(done, **completed)
    assert after == (before[0] + 1, before[1] + 1)
    assert sample("tool_dispatcher_dispatch_seconds_sum", capability="refund") > sum_before
    # A real round trip takes time; no other outcome class was counted besides.
    assert sample(done, capability="refund", outcome="unknown") == unknown


async def test_a_take_over_and_the_zombie_outcome_it_fences_are_counted(
    sessions: Sessions, registry: CapabilityRegistry, executor: Executor
) -> None:
    taken = "tool_dispatcher_recoveries_total"
    fenced = "tool_dispatcher_fenced_outcomes_total"
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="m-zombie")
    claim = await executor.claim(call, "acme")
    assert claim is not None
    took, fenced_before = (
        sample(taken, rule="mark_unknown", capability="refund"),
        sample(fenced, capability="refund"),
    )

    assert (await recover_expired(sessions, registry, topics=DEFAULT_TOPICS)).total == 0
    assert sample(taken, rule="mark_unknown", capability="refund") == took  # lease still valid
    await expire_leases(sessions)
    assert (await recover_expired(sessions, registry, topics=DEFAULT_TOPICS)).marked_unknown == [
        call
    ]
    assert sample(taken, rule="mark_unknown", capability="refund") == took + 1

    late = ProviderOutcome(OutcomeKind.COMPLETED, 1, 200, "req_late", {"ok": True})
    assert await executor.record(claim, late) is None
    assert sample(fenced, capability="refund") == fenced_before + 1


async def test_a_read_only_take_over_is_counted_under_its_rule(
    sessions: Sessions, registry: CapabilityRegistry, executor: Executor
) -> None:
    taken = "tool_dispatcher_recoveries_total"
    call = await submit_call(sessions, registry, "lookup", {"n": 1}, key="m-ro")
    assert await executor.claim(call, "acme") is not None
    await expire_leases(sessions)
    before = sample(taken, rule="redispatch", capability="lookup")
    assert (await recover_expired(sessions, registry, topics=DEFAULT_TOPICS)).redispatched == [call]
    assert sample(taken, rule="redispatch", capability="lookup") == before + 1


async def test_a_redrive_is_counted_by_capability(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    redriven = "tool_dispatcher_redrives_total"
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="m-redrive")
    back = text("now() - interval '120 seconds'")
    async with sessions() as session, session.begin():
        # The broker forgot the published command: the call waits in authorized.
        await session.execute(update(outbox).values(published_at=back, created_at=back))
        await session.execute(update(tool_calls).values(updated_at=back, created_at=back))
    before = sample(redriven, capability="refund")

    assert await redrive_stale(sessions, topics=DEFAULT_TOPICS, older_than_seconds=60) == [call]
    assert sample(redriven, capability="refund") == before + 1
    # Its fresh command is proof enough: the next sweep re-drives nothing, counts nothing.
    assert await redrive_stale(sessions, topics=DEFAULT_TOPICS, older_than_seconds=60) == []
    assert sample(redriven, capability="refund") == before + 1


@pytest.mark.kafka
async def test_the_consumer_lag_is_what_a_fetch_left_behind(kafka_bootstrap: str) -> None:
    topic = f"lag-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for i in range(5):
            await producer.send_and_wait(topic, f"m{i}".encode(), partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=f"lag-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=2,
    )
    await consumer.start()
    try:
        lags = []
        fetched = 0
        while fetched < 5:
            batches = await consumer.getmany(timeout_ms=1000)
            observe_lag(consumer, batches)
            if batches:
                fetched += sum(len(rs) for rs in batches.values())
                lags.append(sample("tool_dispatcher_worker_consumer_lag", partition="0"))
        assert lags == [3, 1, 0]  # 5 messages, fetched two at a time
        # The partition given away: its series goes (no stale lag to sum).
        consumer.unsubscribe()
        observe_lag(consumer, {})
        assert (
            REGISTRY.get_sample_value("tool_dispatcher_worker_consumer_lag", {"partition": "0"})
            is None
        )
    finally:
        await consumer.stop()
