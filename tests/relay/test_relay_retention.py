"""Published rows are deleted in bounded batches; nothing unpublished ever is. A running
relay keeps purging, pass after pass, and keeps rows younger than the retention."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from outbox_relay import purge_published, run_once
from tests.fixtures.relay import RunningRelay, insert, message, relay_config, scalar
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]


async def test_purges_old_published_rows_in_bounded_batches(
    database_url: str, kafka_bootstrap: str
) -> None:
    await insert(database_url, [message("t", f"k{i}", i) for i in range(40)])
    await run_once(relay_config(database_url, kafka_bootstrap, topic_prefix="relay-retention-"))
    await scalar(
        database_url,
        "WITH u AS (UPDATE outbox SET published_at = now() - interval '25 hours' "
        "WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT 30) RETURNING 1) "
        "SELECT count(*) FROM u",
    )
    # Old but never published: retention must not touch it.
    await insert(database_url, [message("t", "late", 0)])
    await scalar(
        database_url,
        "WITH u AS (UPDATE outbox SET created_at = now() - interval '3 days' "
        "WHERE published_at IS NULL RETURNING 1) SELECT count(*) FROM u",
    )

    assert await purge_published(database_url, batch_size=7, max_batches=2) == 14
    assert await purge_published(database_url, batch_size=7) == 16
    assert await purge_published(database_url, batch_size=7) == 0

    assert await scalar(database_url, "SELECT count(*) FROM outbox") == 11
    assert await scalar(database_url, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == 1


async def test_running_relay_applies_retention(database_url: str, kafka_bootstrap: str) -> None:
    await insert(database_url, [message("t", f"k{i}", i) for i in range(10)])
    config = relay_config(
        database_url,
        kafka_bootstrap,
        topic_prefix="relay-retention-",
        retention=timedelta(0),
        retention_interval=0.1,
        metrics_interval=0.1,
    )
    async with RunningRelay(config):
        for _ in range(100):
            if await scalar(database_url, "SELECT count(*) FROM outbox") == 0:
                break
            await asyncio.sleep(0.1)
    assert await scalar(database_url, "SELECT count(*) FROM outbox") == 0


async def test_retention_keeps_running_and_deletes_in_batches(
    database_url: str, kafka_bootstrap: str
) -> None:
    """Rows published after a purge pass are purged by a later one; a pass larger than
    one batch deletes them all."""
    config = relay_config(
        database_url,
        kafka_bootstrap,
        topic_prefix="relay-retention-",
        retention=timedelta(0),
        retention_interval=0.05,
        retention_batch=3,
        metrics_interval=0.05,
    )

    async def empty() -> bool:
        return await scalar(database_url, "SELECT count(*) FROM outbox") == 0

    async with RunningRelay(config):
        await insert(database_url, [message("t", f"k{i}", i) for i in range(10)])
        await eventually(empty, within=10, every=0.05)
        await insert(database_url, [message("t", f"k{i}", i) for i in range(4)])
        await eventually(empty, within=10, every=0.05)


async def test_retention_keeps_rows_younger_than_the_retention(
    database_url: str, kafka_bootstrap: str
) -> None:
    config = relay_config(
        database_url,
        kafka_bootstrap,
        topic_prefix="relay-retention-",
        retention=timedelta(hours=1),
        retention_interval=0.05,
        metrics_interval=0.05,
    )
    await insert(database_url, [message("t", f"k{i}", i) for i in range(4)])

    async def published() -> bool:
        return (
            await scalar(database_url, "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
            == 4
        )

    async with RunningRelay(config):
        await eventually(published, within=10, every=0.05)
        await scalar(
            database_url,
            "WITH u AS (UPDATE outbox SET published_at = now() - interval '2 hours' "
            "WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT 2) RETURNING 1) "
            "SELECT count(*) FROM u",
        )

        async def purged() -> bool:
            return await scalar(database_url, "SELECT count(*) FROM outbox") == 2

        await eventually(purged, within=10, every=0.05)
    assert await scalar(database_url, "SELECT count(*) FROM outbox") == 2
