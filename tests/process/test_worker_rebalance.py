"""A worker whose group rebalanced while its batch was in flight carries on consuming
instead of exiting, and the redelivered command is not executed twice (real processes,
real broker).

Whether that batch's commit is then refused or taken depends on whether the worker's
rejoin wins the race against it (Tansu also takes a reset member's generation -1
commit), so this test does not insist on either; the refusal itself is forced and
checked in test_worker_commit.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.sandbox import SandboxServer
from dispatcher.capabilities import load_registry
from tests.fixtures.calls import submit_call
from tests.fixtures.rows import call_row
from tests.fixtures.sandbox import add_fault, at_provider, books
from tests.fixtures.stack import MakeStack
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]

SESSION_TIMEOUT_MS = 2000


async def test_worker_survives_a_rebalance_between_its_batch_and_its_commit(
    make_stack: MakeStack,
    sessions: async_sessionmaker[AsyncSession],
    sandbox: SandboxServer,
    kafka_bootstrap: str,
) -> None:
    # A provider timeout far beyond the pause below, so the paused call's lease and
    # timeout cannot expire: only the worker's group membership goes stale.
    stack = make_stack(
        sandbox_url=sandbox.url,
        capability={"timeout": 60.0, "attempts": 1},
        kafka_session_timeout_ms=SESSION_TIMEOUT_MS,
    )
    registry = load_registry(Path(stack.env["TOOL_DISPATCHER_CAPABILITIES_FILE"]))
    # The provider takes its time, so the worker is caught with its batch in flight; the
    # answer only has to come after the pause below begins, and a paused worker waits.
    await add_fault(
        sandbox.url, {"kind": "latency", "latencyMs": 2000, "idempotencyKey": at_provider("rb-1")}
    )
    stack.start("relay")
    worker = stack.start("worker")
    first = await submit_call(
        sessions, registry, "refund", {"orderId": "o-1"}, key="rb-1", topics=stack.topics
    )

    async def in_flight() -> bool:
        return (await books(sandbox.url))["received"].get(at_provider("rb-1"), 0) == 1

    await eventually(in_flight, what="the first request to reach the provider")
    # Paused, the worker can neither heartbeat nor rejoin: the group rebalances to a
    # newcomer without it (once its session expires, on Kafka) and the worker's
    # generation is stale. The newcomer taking every partition shows it happened.
    os.killpg(worker.pid, signal.SIGSTOP)
    newcomer = AIOKafkaConsumer(
        stack.topics["dispatch"],
        bootstrap_servers=kafka_bootstrap,
        group_id=stack.env["TOOL_DISPATCHER_WORKER_GROUP_ID"],
        enable_auto_commit=False,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=SESSION_TIMEOUT_MS // 4,
    )
    await newcomer.start()
    try:

        async def took_over() -> bool:
            partitions = newcomer.partitions_for_topic(stack.topics["dispatch"]) or set()
            held = {tp.partition for tp in newcomer.assignment()}
            return bool(partitions) and held == partitions

        await eventually(took_over, what="the newcomer to be assigned every partition")
    finally:
        await newcomer.stop()  # leaves the group, so the worker can have it back

    # Woken, the worker records the provider's answer and its commit is refused.
    os.killpg(worker.pid, signal.SIGCONT)

    async def settled() -> bool:
        return bool((await call_row(sessions, first))["status"] == "completed")

    await eventually(settled, what="the first call to be recorded")

    second = await submit_call(
        sessions, registry, "refund", {"orderId": "o-2"}, key="rb-2", topics=stack.topics
    )

    async def second_done() -> bool:
        return worker.poll() is not None or (
            (await call_row(sessions, second))["status"] == "completed"
        )

    await eventually(second_done, what="the second call to be executed")
    log = stack.log_of(worker)
    assert worker.poll() is None, log
    # The redelivered first command was dropped by its state, not executed again.
    assert (await books(sandbox.url))["effects"] == {at_provider("rb-1"): 1, at_provider("rb-2"): 1}
