"""A recorded batch whose offsets the group refuses must not stop the worker: the refusal
is logged and swallowed, the offsets stay where they were (so the batch is redelivered
and dropped by its calls' state). Real broker, real group; the refusal is forced, not
left to a race.

To make this member's generation stale for certain, its event loop is blocked (a
synchronous wait, so no heartbeat can run) while another process joins the group and
takes every partition. The commit is then the very next thing the loop runs, ahead of
the overdue heartbeat that would have told the member it was out.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from typing import NamedTuple

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import OffsetAndMetadata

from dispatcher.worker.consumer import commit_recorded

pytestmark = [pytest.mark.kafka]

SESSION_TIMEOUT_MS = 2000
PARTITIONS = 2

# Joins the group, says so once it holds every partition, then stays until stdin closes.
TAKER = """
import asyncio, sys
from aiokafka import AIOKafkaConsumer

async def main(bootstrap, topic, group, partitions, session_ms):
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
        session_timeout_ms=int(session_ms), heartbeat_interval_ms=int(session_ms) // 4,
    )
    await consumer.start()
    while len(consumer.assignment()) < int(partitions):
        await asyncio.sleep(0.05)
    print("holding", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await consumer.stop()

asyncio.run(main(*sys.argv[1:]))
"""


class Member(NamedTuple):
    consumer: AIOKafkaConsumer
    topic: str
    group: str


@pytest.fixture
async def member(kafka_bootstrap: str) -> AsyncIterator[Member]:
    """A group member holding every partition of a topic of its own."""
    topic, group = f"commit-{uuid.uuid4().hex[:8]}", f"commit-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        enable_auto_commit=False,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=SESSION_TIMEOUT_MS // 4,
    )
    await consumer.start()
    try:
        while len(consumer.assignment()) < PARTITIONS:
            await consumer.getmany(timeout_ms=100)
        yield Member(consumer, topic, group)
    finally:
        await consumer.stop()


async def _committed(bootstrap: str, group: str, tp: TopicPartition) -> int | None:
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await reader.start()
    try:
        committed: int | None = await reader.committed(tp)
        return committed
    finally:
        await reader.stop()


async def test_a_commit_refused_after_a_rebalance_is_logged_not_raised(
    member: Member, kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = member.topic, member.group
    argv = [sys.executable, "-c", TAKER, kafka_bootstrap, topic, group, str(PARTITIONS)]
    # Blocking on purpose (hence no asyncio subprocess): this member must go silent
    # until the taker holds everything.
    with subprocess.Popen(  # noqa: ASYNC220
        [*argv, str(SESSION_TIMEOUT_MS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as taker:
        assert taker.stdin is not None and taker.stdout is not None
        try:
            assert taker.stdout.readline() == b"holding\n"
            tp = TopicPartition(topic, 0)
            with caplog.at_level(logging.WARNING, logger="dispatcher.worker.consumer"):
                await commit_recorded(member.consumer, {tp: OffsetAndMetadata(1, "")})
            assert "not committed: the group rebalanced" in caplog.text
            assert await _committed(kafka_bootstrap, group, tp) is None
        finally:
            taker.stdin.close()
            taker.wait(timeout=30)


async def test_a_commit_of_a_partition_no_longer_held_is_logged_not_raised(
    member: Member, caplog: pytest.LogCaptureFixture
) -> None:
    # What a member sees once a completed rebalance gave some of its partitions away.
    gone = TopicPartition(member.topic, PARTITIONS)
    with caplog.at_level(logging.WARNING, logger="dispatcher.worker.consumer"):
        await commit_recorded(member.consumer, {gone: OffsetAndMetadata(1, "")})
    assert f"not committed: IllegalStateError: Partition {gone} is not assigned" in caplog.text
