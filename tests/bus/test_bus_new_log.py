"""A request topic that comes back as a new log: a broker that lost its data (this one,
Tansu, forgets everything when it stops; Kafka after an unclean election or a topic
deleted and made again) starts its partitions at offset 0 again, below the offsets bus
intake recorded. Every record of the new log must still be recorded and answered once,
and a redelivery of the same log must still write nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from devtools.embedded import Tansu
from dispatcher.capabilities import CapabilityRegistry
from tests.fixtures.bus import BusWorld, body, bus_intake, headers, producing, rows
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]

PARTITIONS = 3
OLD = 10
"""Records on each partition before the broker forgets them."""


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Tansu]:
    """A broker of this test's own, to be restarted empty."""
    tansu = Tansu(log_file=tmp_path / "tansu.log")
    tansu.start()
    try:
        yield tansu
    finally:
        tansu.stop(kill=True)


async def make_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, per_partition: dict[int, int], tag: str) -> None:
    async with producing(bootstrap) as producer:
        for partition, count in per_partition.items():
            for i in range(count):
                await producer.send_and_wait(
                    topic, body(f"run-{tag}-{partition}-{i}"), partition=partition,
                    headers=headers(f"{tag}-{partition}-{i}"),
                )  # fmt: skip


async def answered(database_url: str, replies: str) -> dict[str, int]:
    found = await rows(
        database_url,
        "SELECT headers->>'ce_requestid', count(*) FROM outbox WHERE topic = %s GROUP BY 1",
        replies,
    )
    return {request: int(n) for request, n in found}


async def test_records_of_a_new_log_below_the_recorded_offsets_are_recorded(
    broker: Tansu, database_url: str, registry: CapabilityRegistry
) -> None:
    world = BusWorld(broker.bootstrap, database_url, ["acme"])
    # Two records a fetch: most partitions are judged over several batches.
    settings = world.settings(bus={"batch_max": 2})
    topic, replies = world.topic("acme"), f"td-{world.run}.replies.acme"
    await make_topic(broker.bootstrap, topic)
    await produce(broker.bootstrap, topic, dict.fromkeys(range(PARTITIONS), OLD), "old")
    async with bus_intake(settings, registry):
        await eventually(
            lambda: _count(database_url, replies, PARTITIONS * OLD),
            what="the first log recorded",
        )

    # The broker forgets the topic, its records and the group's offsets.
    broker.stop(kill=True)
    broker.start()
    await make_topic(broker.bootstrap, topic)
    # Partition 0's new log ends below its recorded offset (its high watermark tells);
    # partition 1's reaches past it (only the record at the recorded offset - 1 tells:
    # another record); partition 2 gets nothing new.
    await produce(broker.bootstrap, topic, {0: 3, 1: OLD + 4}, "new")
    async with bus_intake(settings, registry):
        await eventually(
            lambda: _count(database_url, replies, PARTITIONS * OLD + 3 + OLD + 4),
            what="the new log recorded",
        )
        await asyncio.sleep(1)  # nothing more comes: each record is answered once

    found = await answered(database_url, replies)
    assert set(found) == (
        {f"old-{p}-{i}" for p in range(PARTITIONS) for i in range(OLD)}
        | {f"new-0-{i}" for i in range(3)}
        | {f"new-1-{i}" for i in range(OLD + 4)}
    )
    assert set(found.values()) == {1}, {k: n for k, n in found.items() if n != 1}
    calls = await rows(database_url, "SELECT count(*) FROM tool_calls")
    assert calls == [(PARTITIONS * OLD + 3 + OLD + 4,)]
    offsets = await rows(
        database_url,
        "SELECT partition, next_offset FROM bus_offsets WHERE topic = %s ORDER BY 1",
        topic,
    )
    assert offsets == [(0, 3), (1, OLD + 4), (2, OLD)]


async def _count(database_url: str, replies: str, wanted: int) -> bool:
    return sum((await answered(database_url, replies)).values()) >= wanted
