"""Prometheus metrics of the relay (module-level, so any exporter in the process
serves them). Labelled by outbox table, so one process may relay several outboxes."""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from outbox_relay.settle import Settlement

log = logging.getLogger("outbox_relay.relay")

BACKLOG = Gauge(
    "outbox_relay_backlog_rows",
    "Unpublished rows waiting to be relayed (dead letters excluded).",
    ["table"],
)
OLDEST_AGE = Gauge(
    "outbox_relay_oldest_unpublished_age_seconds",
    "Age of the oldest unpublished row that is not dead-lettered; 0 when none.",
    ["table"],
)
DEAD_LETTERS = Gauge(
    "outbox_relay_dead_letter_rows",
    "Rows currently in the dead-letter state.",
    ["table"],
)
BLOCKED = Gauge(
    "outbox_relay_blocked_rows",
    "Rows waiting behind a dead letter of the same key.",
    ["table"],
)
PUBLISHED = Counter(
    "outbox_relay_published_total",
    "Rows the broker acknowledged and the relay marked published.",
    ["table"],
)
PUBLISH_ERRORS = Counter(
    "outbox_relay_publish_errors_total",
    "Failed sends, by kind (transient: retried; permanent: dead-lettered).",
    ["table", "kind"],
)
DEAD_LETTERED = Counter(
    "outbox_relay_dead_lettered_total",
    "Rows moved to the dead-letter state.",
    ["table"],
)
BATCH_SIZE = Histogram(
    "outbox_relay_batch_rows",
    "Rows read per batch.",
    ["table"],
    buckets=(0, 1, 5, 10, 50, 100, 250, 500, 1000, 2500, 5000),
)
LATENCY = Histogram(
    "outbox_relay_commit_to_publish_seconds",
    "From the row's created_at (its transaction's start) to the broker's acknowledgement.",
    ["table"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
OWNED_LANES = Gauge(
    "outbox_relay_owned_lanes",
    "Lanes this relay instance currently holds a lease on.",
    ["table"],
)
REORDERED = Counter(
    "outbox_relay_possibly_reordered_total",
    "Rows the broker acknowledged behind a failed row of the same key in one batch; "
    "they are re-sent after it, but the first copy is already ahead of it.",
    ["table"],
)


def observe_many(histogram: Histogram, values: Iterable[float]) -> None:
    """``histogram.observe`` for every value, at a fraction of the cost.

    A batch publishes thousands of rows; one locked ``observe`` per row cost the relay
    about a tenth of its throughput. Counting the batch into buckets first and adding
    each bucket once gives the same histogram. Falls back to ``observe`` if the
    client library's internals ever change.
    """
    bounds: list[float] | None = getattr(histogram, "_upper_bounds", None)
    buckets: list[Any] | None = getattr(histogram, "_buckets", None)
    total: Any = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for value in values:
            histogram.observe(value)
        return
    counts = [0] * len(bounds)
    amount = 0.0
    for value in values:
        counts[bisect_left(bounds, value)] += 1
        amount += value
    for bucket, count in zip(buckets, counts, strict=True):
        if count:
            bucket.inc(count)
    total.inc(amount)


def count_settlement(result: Settlement, labels: dict[str, str]) -> None:
    """Count a finished batch, and say what an operator must hear of: dead letters and
    rows held back behind a failed one (logged as the relay's own records)."""
    if result.published:
        PUBLISHED.labels(**labels).inc(len(result.published))
        now = datetime.now(UTC).timestamp()
        observe_many(
            LATENCY.labels(**labels),
            [now - row.created_at.timestamp() for row in result.published],
        )
    for row, error in result.dead:
        DEAD_LETTERED.labels(**labels).inc()
        PUBLISH_ERRORS.labels(kind="permanent", **labels).inc()
        log.error(
            "outbox row %s (key %r, topic %r) dead-lettered: %s; later rows of this key "
            "wait until it is retried or discarded",
            row.id,
            row.key,
            row.topic,
            error,
        )
    if result.failed:
        PUBLISH_ERRORS.labels(kind="transient", **labels).inc(len(result.failed))
    if result.held_back:
        REORDERED.labels(**labels).inc(len(result.held_back))
        log.warning(
            "%d row(s) were acknowledged behind a failed row of their key and will be "
            "sent again after it (first id %s)",
            len(result.held_back),
            result.held_back[0].id,
        )
