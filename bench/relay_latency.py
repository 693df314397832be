"""Commit-to-consumer latency, and the broker's own beside it.

Both rounds write at the same steady rate and read with the same consumer. The relay's
round commits rows; the broker's own sends the same messages straight to the topics
with a producer, so it shows the broker's and the consumer's share (Tansu holds every
fetch for its whole ``fetch_max_wait_ms``), which no relay can go under on this machine.

Tansu's fetches slow with the length of the partition they read (a memory store): at
1,000 messages/s its own produce-to-consumer p50 went from 2.4 ms over the first 3,000
messages of a topic to 29 ms over messages 18,000 to 21,000, p99 from 9 to 138 ms.
Apache Kafka reads a partition by offset index and does not. So each round moves to a
fresh topic every :data:`MESSAGES_PER_TOPIC` messages (the relay does not care which
topic a row names), and measures the relay, not that quirk.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from outbox_relay.kafka import kafka_headers

# As a worker's consumer of commands fetches (the settings' kafka_fetch_max_wait_ms).
FETCH_MAX_WAIT_MS = 10
MESSAGES_PER_TOPIC = 2000

Row = tuple[str, str, str, str]
"""An outbox row as the relay benchmark writes it: topic, key, payload, headers (JSON)."""


def topics_for(prefix: str, total: int) -> list[str]:
    """The topics a round of ``total`` messages moves through, in order."""
    return [f"{prefix}-{j}" for j in range(-(-total // MESSAGES_PER_TOPIC))]


def rotating_rows(
    make: Callable[[int, str], list[Row]], topics: Sequence[str], total: int
) -> list[Row]:
    """``total`` rows, the first :data:`MESSAGES_PER_TOPIC` on the first topic, and so on."""
    rows: list[Row] = []
    for topic in topics:
        rows += make(min(MESSAGES_PER_TOPIC, total - len(rows)), topic)
    return rows


async def create_topics(bootstrap: str, topics: Sequence[str]) -> None:
    """The topics, made before the consumer starts, so it has partitions to follow."""
    warm = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False)
    await warm.start()
    try:
        for topic in topics:
            await warm.partitions_for(topic)
    finally:
        await warm.stop()


def latency_consumer(bootstrap: str, topics: Sequence[str]) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
    )


async def arrivals(consumer: AIOKafkaConsumer, total: int) -> dict[str, float]:
    """When each of the first ``total`` messages (by ``ce_id``) was read."""
    arrived: dict[str, float] = {}
    while len(arrived) < total:
        batches = await consumer.getmany(timeout_ms=100)
        now = time.perf_counter()
        for records in batches.values():
            for r in records:
                arrived.setdefault(dict(r.headers)["ce_id"].decode(), now)
    return arrived


async def paced(total: int, rate: int, write: Callable[[int], Awaitable[str]]) -> dict[str, float]:
    """``write(i)`` for each i at ``rate``/s; when each returned, by the id it gave."""
    done: dict[str, float] = {}
    start = time.perf_counter()
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        ce_id = await write(i)
        done[ce_id] = time.perf_counter()
    return done


async def producer_latency(
    bootstrap: str, topics: Sequence[str], rows: list[Row], rate: int
) -> list[float]:
    """Send-to-consumer latency of ``rows``, as the relay would publish them, at ``rate``/s."""
    await create_topics(bootstrap, topics)
    consumer = latency_consumer(bootstrap, topics)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all")
    await producer.start()
    await consumer.start()
    try:
        reader = asyncio.create_task(arrivals(consumer, len(rows)))

        async def send(i: int) -> str:
            topic, key, payload, raw_headers = rows[i]
            headers = json.loads(raw_headers)
            await producer.send(
                topic, payload.encode(), key=key.encode(), headers=kafka_headers(headers)
            )
            return str(headers["ce_id"])

        sent = await paced(len(rows), rate, send)
        arrived = await asyncio.wait_for(reader, timeout=60)
    finally:
        await consumer.stop()
        await producer.stop()
    return sorted(arrived[i] - sent[i] for i in sent)
