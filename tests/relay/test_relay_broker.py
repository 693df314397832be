"""The broker goes away mid-stream and comes back empty (Tansu keeps nothing): rows it
never acknowledged stay unmarked and are published again, none lost; each failure is
recorded on its row and reported, with no transaction held open while the relay waits."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from devtools.databases import unique_name
from devtools.embedded import Tansu
from outbox_relay.relay import TRANSIENT, Relay, TransientPublishError
from tests.fixtures.relay import (
    RunningRelay,
    TopicReader,
    assert_key_order,
    insert,
    message,
    relay_config,
    scalar,
    unpublished,
)
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"table": "outbox", **labels}) or 0.0


async def test_rows_the_broker_did_not_acknowledge_are_published_again(
    database_url: str, own_broker: Tansu
) -> None:
    """The fast tier's guard of at least once: one relay, one batch sent while the broker
    is down (its metadata already known, so the sends are queued and only the
    acknowledgements fail), then the broker back."""
    topic = unique_name("relay-unacked")
    config = relay_config(database_url, own_broker.bootstrap, request_timeout_ms=1000)
    async with Relay(config) as relay:
        await relay.heartbeat()
        await insert(database_url, [message(topic, "k0", 0)])
        assert (await relay.run_once()).published == 1

        own_broker.stop(kill=True)
        await insert(database_url, [message(topic, f"k{i % 3}", i) for i in range(1, 11)])
        with pytest.raises(TRANSIENT):
            await relay.run_once()
        assert await unpublished(database_url) == 10  # sent, never acknowledged: unmarked

        own_broker.start()  # the same port, and empty

        async def drained() -> bool:
            try:
                await relay.run_once()
            except TRANSIENT:
                return False
            return await unpublished(database_url) == 0

        await eventually(drained, within=90, every=0.1)
    async with TopicReader(own_broker.bootstrap, topic) as reader:
        messages = await reader.distinct(10, within=20)
    assert {m.seq for m in messages} == set(range(1, 11))
    assert_key_order(messages)


@pytest.mark.slow
async def test_broker_outage_marks_nothing_and_catches_up(
    database_url: str, own_broker: Tansu
) -> None:
    topic = unique_name("relay-outage")
    bootstrap = own_broker.bootstrap
    config = relay_config(database_url, bootstrap, request_timeout_ms=1500)

    async def drained() -> bool:
        return await unpublished(database_url) == 0

    async with RunningRelay(config):
        await insert(database_url, [message(topic, f"k{i % 5}", i) for i in range(50)])
        async with TopicReader(bootstrap, topic) as reader:
            await reader.distinct(50, within=20)
        # The relay marks a row after the broker's ack, which can come after a reader
        # already fetched it: wait for the marks, so that none lands after down_at.
        await eventually(drained, within=30, every=0.1)

        own_broker.stop(kill=True)
        down_at = await scalar(database_url, "SELECT now()")
        written = [message(topic, f"k{i % 5}", i) for i in range(50, 150)]
        for start in range(0, len(written), 10):
            await insert(database_url, written[start : start + 10])
            await asyncio.sleep(0.1)

        async def settled_one() -> bool:
            """The relay finished a batch of rows written during the outage: recorded a
            failure (or, wrongly, a publication)."""
            return bool(
                await scalar(
                    database_url,
                    "SELECT count(*) > 0 FROM outbox WHERE created_at >= %s "
                    "AND (attempts >= 1 OR published_at IS NOT NULL)",
                    down_at,
                )
            )

        # Several request timeouts and retries while it is down, at least one of them
        # finished before the checks below.
        await asyncio.sleep(4)
        await eventually(settled_one, within=30, every=0.1)
        assert await unpublished(database_url) == 100
        assert (
            await scalar(
                database_url,
                "SELECT count(*) FROM outbox WHERE published_at >= %s",
                down_at,
            )
            == 0
        )
        assert (
            await scalar(
                database_url, "SELECT max(attempts) FROM outbox WHERE created_at >= %s", down_at
            )
            >= 1
        )

        # Read before the restart: the broker is certainly down all of [down_at, up_at).
        up_at = await scalar(database_url, "SELECT now()")
        own_broker.start()
        await eventually(drained, within=60, every=0.1)
        assert (
            await scalar(
                database_url,
                "SELECT count(*) FROM outbox WHERE published_at >= %s AND published_at < %s",
                down_at,
                up_at,
            )
            == 0
        )
        # The restarted broker is empty: what it holds now is exactly what was written
        # while it was down, each key in order. A produce that timed out but was written
        # is sent again (at least once), so the order is that of first deliveries.
        async with TopicReader(bootstrap, topic) as reader:
            messages = await reader.distinct(100, within=30)
            await reader.poll(0.5)
    assert {m.seq for m in messages} == set(range(50, 150))
    assert_key_order(messages)
    assert (
        await scalar(database_url, "SELECT count(*) FROM outbox WHERE dead_lettered_at IS NOT NULL")
        == 0
    )


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
