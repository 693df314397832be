"""Mutants of ``outbox_relay/relay.py`` the other relay tests leave alive
(``python -m bench.mutation --module outbox_relay/relay.py``): what one batch reports
and records, the gauges, and the background chores of a running relay. Each test is
fast enough to run once per mutant."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from prometheus_client import REGISTRY

from dispatcher.testing.databases import unique_name
from dispatcher.testing.embedded import Tansu
from outbox_relay.relay import BatchResult, Relay, TransientPublishError
from tests.fixtures.relay import RunningRelay, insert, message, relay_config, scalar
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"table": "outbox", **labels}) or 0.0


async def _execute(database_url: str, statement: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(statement)  # type: ignore[arg-type]


async def _age_rows(database_url: str, hours: int) -> None:
    await scalar(
        database_url,
        "WITH u AS (UPDATE outbox SET created_at = now() - make_interval(hours => %s) "
        "RETURNING 1) SELECT count(*) FROM u",
        hours,
    )


async def test_a_batch_reports_what_it_read_published_and_dead_lettered(
    database_url: str, kafka_bootstrap: str
) -> None:
    """One batch, every way a row can end: acknowledged, too big to send (a permanent
    send error), on a topic that cannot exist, and held back behind its key's dead
    letter. The batch goes on past a permanent failure."""
    topic = unique_name("relay-counts")
    big = message(topic, "big", 1)
    big["payload"] = {"key": "big", "seq": 1, "padding": "x" * 20_000}
    await insert(
        database_url,
        [
            message(topic, "big", 0),
            big,
            message(topic, "big", 2),
            message(topic, "other", 0),
            message("not a valid topic!", "bad", 0),
            message(topic, "bad", 1),
            message(topic, "other", 1),
        ],
    )
    await _age_rows(database_url, 1)
    published = _sample("outbox_relay_published_total")
    latency = _sample("outbox_relay_commit_to_publish_seconds_sum")
    permanent = _sample("outbox_relay_publish_errors_total", kind="permanent")
    dead = _sample("outbox_relay_dead_lettered_total")
    reordered = _sample("outbox_relay_possibly_reordered_total")
    config = relay_config(database_url, kafka_bootstrap, max_message_bytes=10_000)

    async with Relay(config) as relay:
        await relay.heartbeat()
        result = await relay.run_once()

    assert result == BatchResult(read=7, published=3, dead_lettered=2, failed=0)
    assert _sample("outbox_relay_published_total") == published + 3
    # Commit to publish, of rows committed an hour ago.
    assert 3 * 3600 <= _sample("outbox_relay_commit_to_publish_seconds_sum") - latency < 3 * 3700
    assert _sample("outbox_relay_publish_errors_total", kind="permanent") == permanent + 2
    assert _sample("outbox_relay_dead_lettered_total") == dead + 2
    # The rows behind a dead letter were not even sent (one sent would have been
    # acknowledged behind its key's failed row): no attempt recorded.
    assert _sample("outbox_relay_possibly_reordered_total") == reordered
    states = await scalar(
        database_url,
        "SELECT array_agg(key || ':' || (payload::jsonb ->> 'seq') || ':' || attempts "
        "ORDER BY id) "
        "FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL",
    )
    assert states == ["big:2:0", "bad:1:0"]


async def test_a_batch_reads_at_most_batch_size_rows(
    database_url: str, kafka_bootstrap: str
) -> None:
    topic = unique_name("relay-batch")
    await insert(database_url, [message(topic, f"k{i}", i) for i in range(5)])
    async with Relay(relay_config(database_url, kafka_bootstrap, batch_size=2)) as relay:
        await relay.heartbeat()
        assert [(await relay.run_once()).read for _ in range(4)] == [2, 2, 1, 0]


async def test_gauges_count_dead_letters_and_log_what_they_block_once(
    database_url: str, kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    await insert(
        database_url,
        [message("not a valid topic!", "bad", 0), message(unique_name("relay-blocked"), "bad", 1)],
    )
    config = relay_config(database_url, kafka_bootstrap)
    caplog.set_level(logging.WARNING, logger="outbox_relay.relay")

    def blocked_warnings() -> int:
        return sum(1 for r in caplog.records if "blocked behind dead letter" in r.getMessage())

    async with Relay(config) as relay:
        await relay.heartbeat()
        assert (await relay.run_once()).dead_lettered == 1
        await insert(database_url, [message("elsewhere", "fine", 0)])
        await relay.refresh_gauges()
        assert _sample("outbox_relay_dead_letter_rows") == 1
        assert _sample("outbox_relay_blocked_rows") == 1
        assert _sample("outbox_relay_backlog_rows") == 2
        assert blocked_warnings() == 1
        # Nothing changed: said once, not at every refresh.
        await relay.refresh_gauges()
        assert blocked_warnings() == 1
        # One more row behind the same dead letter: said again.
        await insert(database_url, [message("elsewhere", "bad", 2)])
        await relay.refresh_gauges()
        assert _sample("outbox_relay_blocked_rows") == 2
        assert blocked_warnings() == 2


async def test_heartbeat_reports_the_lanes_held_and_wakes_the_relay_for_new_ones(
    database_url: str, kafka_bootstrap: str
) -> None:
    async with Relay(relay_config(database_url, kafka_bootstrap)) as relay:
        owned = await relay.heartbeat()
        assert owned
        assert _sample("outbox_relay_owned_lanes") == len(owned)
        assert relay._wake.is_set()  # new lanes may hold rows: read them now
        relay._wake.clear()
        assert await relay.heartbeat() == owned
        assert not relay._wake.is_set()


async def test_a_relay_gives_its_excess_lanes_up_at_its_next_batch(
    database_url: str, kafka_bootstrap: str
) -> None:
    first = relay_config(database_url, kafka_bootstrap, relay_id="relay-first")
    second = relay_config(database_url, kafka_bootstrap, relay_id="relay-second")
    async with Relay(first) as a, Relay(second) as b:
        lanes = await a.heartbeat()
        assert await b.heartbeat() == frozenset()  # every lane is held
        await a.heartbeat()  # sees the second relay: its share halves
        assert a.leases.excess
        await a.run_once()
        kept, taken = a.leases.owned, await b.heartbeat()
    assert kept
    assert taken
    assert taken | kept == lanes
    assert not taken & kept


async def test_a_running_relay_renews_its_leases(database_url: str, kafka_bootstrap: str) -> None:
    config = relay_config(database_url, kafka_bootstrap, lease_ttl=0.6)
    query = "SELECT max(heartbeat_at) FROM outbox_lanes WHERE owner = %s"
    async with RunningRelay(config):

        async def held() -> bool:
            return await scalar(database_url, query, config.relay_id) is not None

        await eventually(held, within=10, every=0.05)
        first = await scalar(database_url, query, config.relay_id)

        async def renewed() -> bool:
            return bool(await scalar(database_url, query, config.relay_id) > first)

        await eventually(renewed, within=10, every=0.05)


async def test_a_failed_lease_renewal_is_retried(
    database_url: str, kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The relays table away for a moment: the renewal fails, and the next one, soon
    after, renews the leases."""
    config = relay_config(database_url, kafka_bootstrap, lease_ttl=0.6)
    query = "SELECT max(heartbeat_at) FROM outbox_lanes WHERE owner = %s"
    caplog.set_level(logging.WARNING, logger="outbox_relay.relay")

    async def failed() -> bool:
        return any("lease heartbeat failed" in r.getMessage() for r in caplog.records)

    async def held() -> bool:
        return await scalar(database_url, query, config.relay_id) is not None

    async with RunningRelay(config):
        await eventually(held, within=10, every=0.05)
        await _execute(database_url, "ALTER TABLE outbox_relays RENAME TO outbox_relays_away")
        await eventually(failed, within=10, every=0.02)
        await _execute(database_url, "ALTER TABLE outbox_relays_away RENAME TO outbox_relays")
        back = await scalar(database_url, "SELECT now()")

        async def renewed() -> bool:
            return bool(await scalar(database_url, query, config.relay_id) > back)

        await eventually(renewed, within=10, every=0.05)


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


@pytest.fixture
def own_broker() -> Iterator[Tansu]:
    broker = Tansu()
    broker.start()
    yield broker
    broker.stop()


async def test_rows_not_acknowledged_are_recorded_and_reported(
    database_url: str, own_broker: Tansu
) -> None:
    topic = unique_name("relay-unacked-report")
    config = relay_config(database_url, own_broker.bootstrap, request_timeout_ms=1000)
    transient = _sample("outbox_relay_publish_errors_total", kind="transient")
    async with Relay(config) as relay:
        await relay.heartbeat()
        await insert(database_url, [message(topic, "k0", 0)])
        assert (await relay.run_once()).published == 1  # the topic's metadata is known

        own_broker.stop(kill=True)
        await insert(database_url, [message(topic, f"k{i % 2}", i) for i in range(1, 4)])
        batch = asyncio.create_task(relay.run_once())
        # While it waits for the broker, the relay holds no transaction open (its
        # statements commit one by one): a long one would hold back vacuum. Recording
        # the failures afterwards is one short transaction: only one open for longer
        # than a poll could see counts.
        open_transactions = "SELECT count(*) FROM pg_stat_activity " + (
            "WHERE datname = current_database() AND state LIKE 'idle in transaction%%'"
            " AND xact_start < now() - interval '200 milliseconds'"
        )
        while not batch.done():
            assert await scalar(database_url, open_transactions) == 0
            await asyncio.sleep(0.02)
        with pytest.raises(TransientPublishError) as raised:
            await batch

    first = await scalar(database_url, "SELECT min(id) FROM outbox WHERE published_at IS NULL")
    error = await scalar(database_url, "SELECT last_error FROM outbox WHERE id = %s", first)
    assert str(raised.value) == f"3 row(s) not acknowledged, first id {first}: {error}"
    assert raised.value.published == 0
    # Each failure is recorded on its row, none marked.
    assert await scalar(
        database_url,
        "SELECT array_agg(attempts ORDER BY id) FROM outbox WHERE published_at IS NULL",
    ) == [1, 1, 1]
    assert _sample("outbox_relay_publish_errors_total", kind="transient") == transient + 3
