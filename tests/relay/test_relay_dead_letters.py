"""Rows the broker can never take: dead-lettered, visible, blocking only their own key;
what one batch reports and records of them, and the gauges that count them and the rows
they block."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import REGISTRY

from devtools.databases import unique_name
from outbox_relay import (
    discard_dead_letter,
    list_dead_letters,
    retry_dead_letter,
    run_once,
)
from outbox_relay.relay import BatchResult, Relay
from tests.fixtures.relay import RunningRelay, TopicReader, insert, message, relay_config, scalar

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"table": "outbox", **labels}) or 0.0


def _big(topic: str, key: str, seq: int) -> dict[str, object]:
    row = message(topic, key, seq)
    row["payload"] = {"key": key, "seq": seq, "padding": "x" * 20_000}
    return row


async def test_poison_row_blocks_its_key_only(database_url: str, kafka_bootstrap: str) -> None:
    topic = unique_name("relay-poison")
    await insert(
        database_url,
        [
            message(topic, "poison", 0),
            _big(topic, "poison", 1),
            message(topic, "poison", 2),
            message(topic, "other", 0),
            message(topic, "poison", 3),
            message(topic, "other", 1),
        ],
    )
    dead_before = _sample("outbox_relay_dead_lettered_total")
    config = relay_config(database_url, kafka_bootstrap, max_message_bytes=10_000)

    async with RunningRelay(config), TopicReader(kafka_bootstrap, topic) as reader:
        await reader.distinct(3, within=20)
        # Give it every chance to (wrongly) send the rows behind the dead letter.
        await reader.until(lambda _: _sample("outbox_relay_blocked_rows") == 2, within=10)
        await reader.poll(0.5)

    assert sorted((m.key, m.seq) for m in reader.messages) == [
        ("other", 0),
        ("other", 1),
        ("poison", 0),
    ]
    assert _sample("outbox_relay_dead_lettered_total") == dead_before + 1
    assert _sample("outbox_relay_dead_letter_rows") == 1
    [dead] = await list_dead_letters(database_url)
    assert (dead.key, dead.attempts) == ("poison", 1)
    assert "MessageSizeTooLargeError" in (dead.last_error or "")
    assert dead.blocked_rows == 2
    assert f"blocked behind dead letter id {dead.id}" in dead.describe()

    # The operator raises the limit and retries: the row, then the ones it held back.
    assert await retry_dead_letter(database_url, dead.id)
    assert not await retry_dead_letter(database_url, dead.id)
    for _ in range(3):
        await run_once(relay_config(database_url, kafka_bootstrap))
    async with TopicReader(kafka_bootstrap, topic) as reader:
        messages = await reader.distinct(6, within=20)
    assert [m.seq for m in messages if m.key == "poison"] == [0, 1, 2, 3]
    assert await list_dead_letters(database_url) == []


async def test_invalid_topic_is_dead_lettered_and_can_be_discarded(
    database_url: str, kafka_bootstrap: str
) -> None:
    good = unique_name("relay-good")
    await insert(
        database_url,
        [
            message("not a valid topic!", "bad", 0),
            message(good, "bad", 1),
            message(good, "fine", 0),
        ],
    )
    config = relay_config(database_url, kafka_bootstrap)

    result = await run_once(config)

    assert (result.published, result.dead_lettered) == (1, 1)
    [dead] = await list_dead_letters(database_url)
    assert "invalid topic name" in (dead.last_error or "")
    assert dead.blocked_rows == 1

    assert await discard_dead_letter(database_url, dead.id)
    assert await scalar(database_url, "SELECT count(*) FROM outbox WHERE id = %s", dead.id) == 0
    await run_once(config)
    async with TopicReader(kafka_bootstrap, good) as reader:
        messages = await reader.distinct(2, within=20)
    assert sorted((m.key, m.seq) for m in messages) == [("bad", 1), ("fine", 0)]


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
