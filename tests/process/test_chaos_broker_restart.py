"""The chaos harness's broker restart gives the run's topics back with their partitions,
even when a client's metadata request reaches the new broker first and it auto-creates
them with its own count (a real Tansu, restarted, and a real client asking all along)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from devtools.chaos.infra import Infrastructure
from devtools.embedded import Tansu
from dispatcher.settings import Settings
from dispatcher.topics import ensure_topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TOPICS = {"dispatch_topic": "c.dispatch", "events_topic": "c.events", "escalations_topic": "c.esc"}


@pytest.fixture
async def infra() -> AsyncIterator[Infrastructure]:
    broker = Tansu()
    bootstrap = await asyncio.to_thread(broker.start)
    topics = Settings(kafka_bootstrap=bootstrap, topic_partitions=8, **TOPICS)
    await ensure_topics(topics)
    try:
        yield Infrastructure("postgresql://unused", bootstrap, None, broker, topics=topics)
    finally:
        await asyncio.to_thread(broker.stop, True)


async def partition_counts(bootstrap: str) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(list(TOPICS.values()))
    finally:
        await admin.close()
    return {d["topic"]: len(d["partitions"]) for d in described if d["error_code"] == 0}


async def keep_asking(producer: AIOKafkaProducer, stop: asyncio.Event) -> None:
    """What every relay and worker does while the broker is away: ask for metadata of
    the topics it uses (by name, as a subscribed consumer does), over and over."""
    await producer.client.set_topics(list(TOPICS.values()))
    while not stop.is_set():
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.client.force_metadata_update(), 0.5)
        await asyncio.sleep(0.002)


async def test_a_restart_gives_the_topics_back_with_their_partitions(
    infra: Infrastructure,
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=infra.kafka_bootstrap, retry_backoff_ms=5)
    await producer.start()
    stop = asyncio.Event()
    try:
        for topic in TOPICS.values():
            assert len(await producer.partitions_for(topic)) == 8
        asking = asyncio.create_task(keep_asking(producer, stop))
        for _ in range(3):
            await infra.kill_broker()
            await infra.start_broker()
            assert await partition_counts(infra.kafka_bootstrap) == dict.fromkeys(
                TOPICS.values(), 8
            )
        stop.set()
        await asking
    finally:
        stop.set()
        await producer.stop()
