"""Pure logic of the relay: settling a batch, lane shares, messages, settings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError, RequestTimedOutError
from prometheus_client import CollectorRegistry, Histogram

from outbox_relay import RelayConfig
from outbox_relay.kafka import OutboxRow, PermanentTopicError, is_permanent, kafka_headers
from outbox_relay.leases import excess_lanes, fair_share
from outbox_relay.metrics import observe_many
from outbox_relay.settle import NOT_SENT, settle

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _row(id_: int, key: str) -> OutboxRow:
    return OutboxRow(id_, "t", key, "{}", {}, NOW)


def test_settle_marks_only_unbroken_prefixes_per_key() -> None:
    rows = [_row(1, "a"), _row(2, "b"), _row(3, "a"), _row(4, "b"), _row(5, "c")]
    timeout = RequestTimedOutError()
    result = settle(rows, [None, timeout, None, None, None])
    assert [r.id for r in result.published] == [1, 3, 5]
    assert [(r.id, "RequestTimedOutError" in e) for r, e in result.failed] == [(2, True)]
    # Acknowledged, but behind a failed row of its key: re-sent after it, not marked.
    assert [r.id for r in result.held_back] == [4]
    assert result.dead == []
    assert result.transient


def test_settle_dead_letters_permanent_failures_and_stops_the_key() -> None:
    rows = [_row(1, "a"), _row(2, "a"), _row(3, "b")]
    result = settle(rows, [MessageSizeTooLargeError("big"), NOT_SENT, None])
    assert [(r.id, "big" in e) for r, e in result.dead] == [(1, True)]
    assert [r.id for r in result.published] == [3]
    assert result.held_back == []
    assert not result.transient


def test_settle_not_sent_breaks_the_key() -> None:
    result = settle([_row(1, "a"), _row(2, "a")], [NOT_SENT, None])
    assert result.published == []
    assert [r.id for r in result.held_back] == [2]


def test_settle_needs_one_outcome_per_row() -> None:
    with pytest.raises(ValueError):
        settle([_row(1, "a")], [])


@pytest.mark.parametrize(
    ("exc", "permanent"),
    [
        (MessageSizeTooLargeError(), True),
        (PermanentTopicError("unknown topic"), True),
        (KafkaConnectionError(), False),
        (RequestTimedOutError(), False),
    ],
)
def test_permanent_failures(exc: BaseException, permanent: bool) -> None:
    assert is_permanent(exc) is permanent


@pytest.mark.parametrize(
    ("lanes", "live", "share"), [(64, 1, 64), (64, 3, 22), (64, 0, 64), (64, 100, 1)]
)
def test_fair_share(lanes: int, live: int, share: int) -> None:
    assert fair_share(lanes, live) == share


def test_excess_lanes_gives_up_the_highest() -> None:
    assert excess_lanes({1, 5, 9, 30}, 2) == [9, 30]
    assert excess_lanes({1, 5}, 2) == []


def test_kafka_headers_carry_cloudevents_attributes_and_content_type() -> None:
    headers = kafka_headers({"ce_id": "x", "traceparent": "00-a-b-01", "n": 3})
    assert headers == [
        ("content-type", b"application/json"),
        ("ce_id", b"x"),
        ("traceparent", b"00-a-b-01"),
        ("n", b"3"),
    ]


def _config(**overrides: object) -> RelayConfig:
    values: dict[str, object] = {"database_url": "postgresql://h/db", "kafka_bootstrap": "b:9092"}
    values.update(overrides)
    return RelayConfig(**values)  # type: ignore[arg-type]


def test_topic_mapping_wins_over_prefix() -> None:
    config = _config(topic_prefix="prod.", topic_map={"cmds": "commands.v1"})
    assert config.kafka_topic("cmds") == "commands.v1"
    assert config.kafka_topic("events") == "prod.events"


def test_sqlalchemy_urls_are_accepted() -> None:
    assert _config(database_url="postgresql+psycopg://u@h/db").conninfo == "postgresql://u@h/db"


@pytest.mark.parametrize(
    "overrides",
    [
        {"table": "Outbox"},
        {"table": "outbox; drop table x"},
        {"database_url": "mysql://h/db"},
        {"kafka_bootstrap": " "},
        {"batch_size": 0},
        {"lease_ttl": -1.0},
        {"retention": timedelta(hours=-1)},
        {"relay_id": ""},
    ],
)
def test_invalid_settings_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _config(**overrides)


def test_observe_many_matches_observe() -> None:
    registry = CollectorRegistry()
    one = Histogram("one", "", buckets=(0.1, 1, 10), registry=registry)
    many = Histogram("many", "", buckets=(0.1, 1, 10), registry=registry)
    values = [0.05, 0.1, 0.5, 1, 2, 10, 11, 100]
    for value in values:
        one.observe(value)
    observe_many(many, values)

    def samples(name: str) -> list[tuple[str, dict[str, str], float]]:
        return [
            (s.name.removeprefix(name), s.labels, s.value)
            for metric in registry.collect()
            if metric.name == name
            for s in metric.samples
            if not s.name.endswith("_created")
        ]

    assert samples("many") == samples("one")
    assert samples("one")
