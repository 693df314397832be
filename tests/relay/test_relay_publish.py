"""The relay against a real PostgreSQL and a real Kafka-protocol broker: what a
message looks like, no skipped rows, wake-up, reconnects."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from prometheus_client import REGISTRY

from devtools.databases import unique_name
from outbox_relay import run_once
from outbox_relay.relay import Relay
from tests.fixtures.relay import (
    INSERT,
    RunningRelay,
    TopicReader,
    first_deliveries,
    insert,
    message,
    relay_config,
    row_params,
    scalar,
    unpublished,
)
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name, {"table": "outbox"}) or 0.0


async def _all_marked(database_url: str) -> None:
    """Wait until every committed row is marked published. A reader can fetch a message
    before the relay, which marks only after the broker's ack, has marked its row."""

    async def marked() -> bool:
        return await unpublished(database_url) == 0

    await eventually(marked, within=30, every=0.05)


async def test_publishes_cloudevents_binary_mode(database_url: str, kafka_bootstrap: str) -> None:
    topic = unique_name("relay-ce")
    traced = message(topic, "order-1", 0, traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    plain = message(topic, "order-2", 1)
    await insert(database_url, [traced, plain])
    published = _sample("outbox_relay_published_total")
    latencies = _sample("outbox_relay_commit_to_publish_seconds_count")
    batches = _sample("outbox_relay_batch_rows_sum")

    result = await run_once(relay_config(database_url, kafka_bootstrap))

    assert result.published == 2
    assert _sample("outbox_relay_published_total") == published + 2
    assert _sample("outbox_relay_commit_to_publish_seconds_count") == latencies + 2
    assert _sample("outbox_relay_batch_rows_sum") == batches + 2
    assert await unpublished(database_url) == 0
    async with TopicReader(kafka_bootstrap, topic) as reader:
        got = {m.key: m for m in await reader.distinct(2, within=20)}
    first = got["order-1"]
    assert first.value == {"key": "order-1", "seq": 0}
    for name in ("ce_id", "ce_type", "ce_source", "ce_specversion", "ce_time"):
        assert first.headers[name] == traced["headers"][name]
    assert first.headers["content-type"] == "application/json"
    assert first.headers["traceparent"] == traced["headers"]["traceparent"]
    assert "traceparent" not in got["order-2"].headers


async def test_topic_prefix_and_map(database_url: str, kafka_bootstrap: str) -> None:
    prefix = unique_name("pfx") + "."
    mapped = unique_name("mapped")
    await insert(database_url, [message("a", "k", 0), message("b", "k", 1)])

    await run_once(
        relay_config(database_url, kafka_bootstrap, topic_prefix=prefix, topic_map={"b": mapped})
    )

    async with TopicReader(kafka_bootstrap, prefix + "a") as reader:
        assert [m.seq for m in first_deliveries(await reader.distinct(1, within=20))] == [0]
    async with TopicReader(kafka_bootstrap, mapped) as reader:
        assert [m.seq for m in first_deliveries(await reader.distinct(1, within=20))] == [1]


async def test_late_committing_lower_id_is_published(
    database_url: str, kafka_bootstrap: str
) -> None:
    """A transaction holding a lower id commits after higher ids were relayed: a
    high-water-mark relay would skip its rows for good."""
    topic = unique_name("relay-gap")
    async with await psycopg.AsyncConnection.connect(database_url) as held:
        # Takes the lower ids and keeps its transaction open.
        async with held.cursor() as cur:
            await cur.execute(
                "INSERT INTO outbox (topic, key, payload, headers) "
                'VALUES (%s, \'shared\', \'{"key": "shared", "seq": 0}\', %s), '
                '       (%s, \'other\', \'{"key": "other", "seq": 0}\', %s) RETURNING id',
                (
                    topic,
                    psycopg.types.json.Jsonb(message(topic, "shared", 0)["headers"]),
                    topic,
                    psycopg.types.json.Jsonb(message(topic, "other", 0)["headers"]),
                ),
            )
            low_ids = [r[0] for r in await cur.fetchall()]
        await insert(database_url, [message(topic, "shared", 1), message(topic, "later", 0)])

        async with RunningRelay(relay_config(database_url, kafka_bootstrap)):
            async with TopicReader(kafka_bootstrap, topic) as reader:
                await reader.distinct(2, within=20)
                # The held rows are invisible here: this waits for the two higher ids.
                await _all_marked(database_url)
                high_ids = await scalar(
                    database_url,
                    "SELECT array_agg(id) FROM outbox WHERE published_at IS NOT NULL",
                )
                assert len(high_ids) == 2
                assert min(high_ids) > max(low_ids)
                await held.commit()
                messages = await reader.distinct(4, within=20)

    assert await unpublished(database_url) == 0
    # Per key, the order the relay saw them commit: the late row comes last (counting
    # first deliveries: a re-sent message after a produce timeout is legal).
    shared = [m.seq for m in first_deliveries(messages) if m.key == "shared"]
    assert shared == [1, 0]
    assert {(m.key, m.seq) for m in messages} == {
        ("shared", 0),
        ("shared", 1),
        ("other", 0),
        ("later", 0),
    }


async def test_notification_wakes_an_idle_relay(database_url: str, kafka_bootstrap: str) -> None:
    """The poll interval is far longer than the test waits, so only NOTIFY can explain
    the row arriving."""
    topic = unique_name("relay-notify")
    config = relay_config(database_url, kafka_bootstrap, poll_interval=600.0)
    async with RunningRelay(config), TopicReader(kafka_bootstrap, topic) as reader:
        # Let it start, take its lanes and go idle.
        await asyncio.sleep(1.0)
        for seq in range(3):
            await insert(database_url, [message(topic, "k", seq)])
            await reader.distinct(seq + 1, within=10)
    assert [m.seq for m in first_deliveries(reader.messages)] == [0, 1, 2]


async def test_a_relay_back_from_a_stream_is_woken_again(
    database_url: str, kafka_bootstrap: str
) -> None:
    """A stream of commits long enough that the relay stops listening, then one more
    row: the poll interval is far longer than the test waits, so only the relay
    listening again can explain that row arriving."""
    topic = unique_name("relay-stream")
    config = relay_config(database_url, kafka_bootstrap, poll_interval=600.0)
    said_unlisten = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND query LIKE 'UNLISTEN %'"
    )
    quiet = 0
    async with RunningRelay(config), TopicReader(kafka_bootstrap, topic) as reader:
        await asyncio.sleep(1.0)  # lanes taken, idle
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            for seq in range(200):  # one commit every 10 ms or so
                await conn.execute(INSERT, row_params([message(topic, "k", seq)])[0])
                quiet += await scalar(database_url, said_unlisten) if seq % 20 == 19 else 0
                await asyncio.sleep(0.01)
        await reader.distinct(200, within=30)
        assert quiet  # the stream was read without notifications
        await asyncio.sleep(1.0)  # idle again
        await insert(database_url, [message(topic, "k", 200)])
        messages = await reader.distinct(201, within=10)
    assert [m.seq for m in first_deliveries(messages)] == list(range(201))


async def test_reconnects_after_database_connections_are_killed(
    database_url: str, kafka_bootstrap: str
) -> None:
    topic = unique_name("relay-reconnect")
    async with RunningRelay(relay_config(database_url, kafka_bootstrap)):
        async with TopicReader(kafka_bootstrap, topic) as reader:
            await insert(database_url, [message(topic, "k", 0)])
            await reader.distinct(1, within=20)
            # Kill the connections of a relay that is done with k0: a kill during its
            # mark would legally send k0 again.
            await _all_marked(database_url)
            # With a timeout, pg_terminate_backend waits until each backend is gone
            # (true) instead of only signalling it.
            killed = await scalar(
                database_url,
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000)) "
                "FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            assert killed >= 2
            await insert(database_url, [message(topic, "k", 1), message(topic, "k", 2)])
            messages = await reader.distinct(3, within=30)
    assert [m.seq for m in first_deliveries(messages)] == [0, 1, 2]
    assert await unpublished(database_url) == 0


async def test_backlog_gauges(database_url: str, kafka_bootstrap: str) -> None:
    await insert(database_url, [message("relay-gauges", f"k{i}", i) for i in range(3)])
    await scalar(
        database_url,
        "WITH u AS (UPDATE outbox SET created_at = now() - interval '1 hour' "
        "WHERE id = (SELECT min(id) FROM outbox) RETURNING 1) SELECT count(*) FROM u",
    )
    async with Relay(relay_config(database_url, kafka_bootstrap)) as relay:
        await relay.refresh_gauges()
        assert _sample("outbox_relay_backlog_rows") == 3
        assert 3600 <= _sample("outbox_relay_oldest_unpublished_age_seconds") < 3700
        await relay.heartbeat()
        await relay.run_once()
        await relay.refresh_gauges()
    assert _sample("outbox_relay_backlog_rows") == 0
    assert _sample("outbox_relay_oldest_unpublished_age_seconds") == 0


async def test_the_read_is_an_index_scan_that_marks_what_it_passed(
    database_url: str, kafka_bootstrap: str
) -> None:
    """On the relay's own connections the read is a plain index scan of the unpublished
    rows in id order: a bitmap scan (the planner's choice when it expects few rows)
    never marks the index entries of published rows dead, and every later read would
    visit each of them in the heap until vacuum ran."""
    await insert(database_url, [message("relay-plan", f"k{i}", i) for i in range(3)])
    async with Relay(relay_config(database_url, kafka_bootstrap)) as relay:
        await relay.heartbeat()
        async with relay._pool.connection() as conn:
            cur = await conn.execute(
                b"EXPLAIN " + relay.queries.claim.as_bytes(conn),
                {"owner": relay.config.relay_id, "limit": 1000},
            )
            plan = "\n".join(row[0] for row in await cur.fetchall())
    assert "Index Scan using ix_outbox_unpublished on outbox o" in plan, plan
    assert "Bitmap" not in plan, plan


async def test_the_blocked_rows_are_found_from_the_dead_letters_index(
    database_url: str, kafka_bootstrap: str
) -> None:
    """On a table without statistics the planner read every row to find the dead
    letters (none): the relay's settings keep it on the dead letters' partial index."""
    await insert(database_url, [message("relay-plan", f"k{i}", i) for i in range(3)])
    async with Relay(relay_config(database_url, kafka_bootstrap)) as relay:
        async with relay._pool.connection() as conn:
            cur = await conn.execute(
                b"EXPLAIN (ANALYZE, TIMING OFF) " + relay.queries.blocked.as_bytes(conn)
            )
            plan = "\n".join(row[0] for row in await cur.fetchall())
    assert "Index Scan using ix_outbox_dead_letters on outbox x" in plan, plan
    assert "Seq Scan" not in plan, plan


async def test_the_relay_commits_without_waiting_for_the_wal_flush(
    database_url: str, kafka_bootstrap: str
) -> None:
    """A crash may lose only a suffix of the relay's marks (rows sent again, in order),
    so its commits do not wait for the disk; every other writer's still do."""
    async with Relay(relay_config(database_url, kafka_bootstrap)) as relay:
        async with relay._pool.connection() as conn:
            cur = await conn.execute("SHOW synchronous_commit")
            assert await cur.fetchone() == ("off",)
    async with await psycopg.AsyncConnection.connect(database_url) as other:
        cur = await other.execute("SHOW synchronous_commit")
        assert await cur.fetchone() == ("on",)


async def test_a_batch_reads_at_most_batch_size_rows(
    database_url: str, kafka_bootstrap: str
) -> None:
    topic = unique_name("relay-batch")
    await insert(database_url, [message(topic, f"k{i}", i) for i in range(5)])
    async with Relay(relay_config(database_url, kafka_bootstrap, batch_size=2)) as relay:
        await relay.heartbeat()
        assert [(await relay.run_once()).read for _ in range(4)] == [2, 2, 1, 0]
