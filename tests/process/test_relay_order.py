"""Per-key order with three relay processes at once, one of them killed mid-run."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import psycopg
import pytest

from devtools.databases import unique_name
from tests.fixtures.relay import (
    INSERT,
    RelayProcess,
    TopicReader,
    assert_key_order,
    message,
    row_params,
    scalar,
    unpublished,
)
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]

TOTAL, KEYS, PRODUCERS = 10_000, 100, 5


async def _produce(database_url: str, topic: str, keys: list[str], count: int) -> None:
    """Write ``count`` rows over ``keys`` in small random transactions; a key's next row
    is written only after its previous one committed (a causal chain per key)."""
    rng = random.Random()
    seq = dict.fromkeys(keys, 0)
    written = 0
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        while written < count:
            size = min(rng.randint(1, 8), count - written)
            rows = []
            for key in rng.choices(keys, k=size):
                rows.append(message(topic, key, seq[key]))
                seq[key] += 1
            async with conn.cursor() as cur:
                await cur.executemany(INSERT, row_params(rows))
            await conn.commit()
            written += size
            await asyncio.sleep(0)


async def test_three_relays_keep_per_key_order(
    database_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = unique_name("relay-order")
    relays = [
        RelayProcess(
            database_url,
            kafka_bootstrap,
            "--batch-size",
            "200",
            "--relay-id",
            f"relay-{i}",
            log=tmp_path / f"relay-{i}.log",
        ).start()
        for i in range(3)
    ]
    try:

        async def shared_out() -> bool:
            owners = await scalar(
                database_url,
                "SELECT count(DISTINCT owner) FROM outbox_lanes WHERE expires_at > now()",
            )
            return bool(owners == 3)

        await eventually(shared_out, within=30, every=0.1)
        keys = [f"key-{i}" for i in range(KEYS)]
        per_producer = TOTAL // PRODUCERS
        producers = [
            asyncio.create_task(_produce(database_url, topic, keys[i::PRODUCERS], per_producer))
            for i in range(PRODUCERS)
        ]
        await eventually(lambda: _at_least(database_url, TOTAL // 2), within=60, every=0.05)
        # A relay dies mid-stream: its lanes pass to the others when its leases lapse.
        relays[0].kill()
        await asyncio.gather(*producers)
        await eventually(lambda: _drained(database_url), within=120, every=0.1)
    finally:
        for relay in relays:
            relay.stop_quietly()

    async with TopicReader(kafka_bootstrap, topic) as reader:
        messages = await reader.distinct(TOTAL, within=60)
        await reader.poll(0.5)
    assert len({m.ce_id for m in messages}) == TOTAL
    assert_key_order(messages)
    by_key: dict[str, list[int]] = {}
    for m in messages:
        by_key.setdefault(m.key, []).append(m.seq)
    assert len(by_key) == KEYS


async def _at_least(database_url: str, count: int) -> bool:
    return bool(await scalar(database_url, "SELECT count(*) FROM outbox") >= count)


async def _drained(database_url: str) -> bool:
    return await unpublished(database_url) == 0 and await _at_least(database_url, TOTAL)
