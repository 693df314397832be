"""Pure logic of the relay: settling a batch, lane shares, messages, settings, the
error a failed batch raises, its cadences (lease renewal, retention), and its loop over
scripted batches: when it reads again at once, waits for a notification, polls, or
backs off."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError, RequestTimedOutError
from prometheus_client import CollectorRegistry, Histogram

from outbox_relay import RelayConfig
from outbox_relay.kafka import OutboxRow, PermanentTopicError, is_permanent, kafka_headers
from outbox_relay.leases import excess_lanes, fair_share
from outbox_relay.metrics import observe_many
from outbox_relay.relay import BatchResult, Relay, TransientPublishError
from outbox_relay.schedule import heartbeat_waits, purge_due
from outbox_relay.settle import NOT_SENT, settle
from tests.fixtures.relay import relay_config

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
        {"read_interval": -0.01},
        {"retention": timedelta(hours=-1)},
        {"relay_id": ""},
    ],
)
def test_invalid_settings_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _config(**overrides)


def test_reads_of_a_stream_may_follow_each_other_at_once() -> None:
    assert _config(read_interval=0.0).read_interval == 0.0


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


def test_a_transient_publish_error_says_why_and_how_many_rows_were_marked() -> None:
    # The relay logs the error and backs off: its text is all an operator sees of why.
    error = TransientPublishError("broker did not acknowledge 3 rows", published=7)
    assert str(error) == "broker did not acknowledge 3 rows"
    assert error.published == 7
    assert TransientPublishError("away").published == 0


def test_leases_are_renewed_three_times_a_term_and_a_failed_renewal_retried_soon() -> None:
    # Two renewals in a row can fail before a lease lapses.
    assert heartbeat_waits(15.0) == (5.0, 1.0)
    # Within a second, but never sooner than the next renewal would be due anyway.
    assert heartbeat_waits(3.0) == (1.0, 1.0)
    assert heartbeat_waits(0.6) == pytest.approx((0.2, 0.2))


def test_retention_runs_when_due_and_then_once_per_interval() -> None:
    assert purge_due(100.0, 100.0, 60.0) == (True, 160.0)
    assert purge_due(100.5, 100.0, 60.0) == (True, 160.5)
    assert purge_due(99.5, 100.0, 60.0) == (False, 100.0)


class StepRelay(Relay):
    """A relay whose batches are scripted steps; the loop around them is the real one."""

    def __init__(self, steps: list[Callable[[Relay], BatchResult]], **overrides: Any) -> None:
        super().__init__(
            relay_config(
                "postgresql://unused@127.0.0.1/unused", "127.0.0.1:1", batch_size=10, **overrides
            )
        )
        self.steps = steps
        self.batches = 0

    async def run_once(self) -> BatchResult:
        self.batches += 1
        return self.steps.pop(0)(self)


async def _run_loop(relay: StepRelay, stop: asyncio.Event) -> None:
    try:
        # A loop that waits when it should read again would wait out the poll interval.
        await asyncio.wait_for(relay._loop(stop), 5)
    finally:
        await relay._producer.stop()


async def test_a_full_batch_is_followed_by_the_next_read_at_once_without_listening() -> None:
    stop = asyncio.Event()
    listening: list[bool] = []

    def full(relay: Relay) -> BatchResult:
        listening.append(relay._listen.is_set())
        return BatchResult(read=10, published=10)

    def last(relay: Relay) -> BatchResult:
        stop.set()
        return full(relay)

    relay = StepRelay([full, full, last], poll_interval=600)
    await _run_loop(relay, stop)
    assert relay.batches == 3
    # A backlog is read as a stream is: no notification for each of its commits.
    assert listening == [True, False, False]
    assert not relay._listen.is_set()


async def test_an_empty_read_listens_and_waits_for_a_notification() -> None:
    stop = asyncio.Event()

    def last(_: Relay) -> BatchResult:
        stop.set()
        return BatchResult()

    relay = StepRelay([lambda _: BatchResult(), last], poll_interval=600)
    relay._listen.clear()  # as after a stream
    loop = asyncio.create_task(_run_loop(relay, stop))
    await asyncio.sleep(0.05)
    assert relay.batches == 1  # idle, waiting
    assert relay._listen.is_set()  # and listening again
    relay._wake.set()  # what the LISTEN task does on a notification
    await loop
    assert relay.batches == 2


async def test_a_short_batch_is_read_again_one_interval_on_without_listening() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    started: list[float] = []
    listening: list[bool] = []

    def step(read: int) -> Callable[[Relay], BatchResult]:
        def run(relay: Relay) -> BatchResult:
            started.append(loop.time())
            listening.append(relay._listen.is_set())
            if not read:
                stop.set()
            return BatchResult(read=read, published=read)

        return run

    # No notification ever comes, and the poll interval is far beyond the test's bound.
    relay = StepRelay([step(3), step(2), step(0)], poll_interval=600, read_interval=0.05)
    await _run_loop(relay, stop)
    assert relay.batches == 3
    # A stream is read without notifications: the listener is told to stop at once.
    assert listening == [True, False, False]
    assert relay._listen.is_set()  # the empty read: idle, listening again
    # The commits of an interval go in one read (the clock's resolution aside).
    assert min(b - a for a, b in itertools.pairwise(started)) >= 0.049


async def test_a_notification_during_a_batch_is_not_lost() -> None:
    stop = asyncio.Event()

    def notified(relay: Relay) -> BatchResult:
        relay._wake.set()  # a row committed while the read was in flight
        return BatchResult()

    def last(_: Relay) -> BatchResult:
        stop.set()
        return BatchResult()

    relay = StepRelay([notified, last], poll_interval=600)
    await _run_loop(relay, stop)
    assert relay.batches == 2


async def test_without_a_notification_an_idle_relay_polls() -> None:
    stop = asyncio.Event()

    def last(_: Relay) -> BatchResult:
        stop.set()
        return BatchResult()

    relay = StepRelay([lambda _: BatchResult(), lambda _: BatchResult(), last], poll_interval=0.01)
    await _run_loop(relay, stop)
    assert relay.batches == 3


async def test_one_row_published_counts_as_progress(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    initial = 0.01

    def failing(published: int) -> Callable[[Relay], BatchResult]:
        def step(_: Relay) -> BatchResult:
            raise TransientPublishError("not acknowledged", published=published)

        return step

    def last(_: Relay) -> BatchResult:
        stop.set()
        return BatchResult()

    relay = StepRelay(
        [failing(0), failing(0), failing(0), failing(1), last],
        backoff_initial=initial,
        backoff_max=1.0,
    )
    caplog.set_level(logging.WARNING, logger="outbox_relay.relay")
    await _run_loop(relay, stop)
    delays = [r.args[1] for r in caplog.records if r.msg.startswith("relay batch failed")]
    # Doubling while nothing got through, back to the initial wait after one row did
    # (plus up to one initial wait of jitter each).
    expected = [initial, 2 * initial, 4 * initial, initial]
    assert len(delays) == len(expected)
    for got, base in zip(delays, expected, strict=True):
        assert base <= got <= base + initial, (delays, expected)  # type: ignore[operator]
