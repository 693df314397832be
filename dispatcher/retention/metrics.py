"""The retention job's metrics. A pass is a CronJob's process that nothing scrapes, so
it pushes them when it ends (:func:`push`, to ``retention_pushgateway_url``): the
Pushgateway keeps each metric's value from the last pass that pushed it."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    push_to_gateway,
    pushadd_to_gateway,
)

ARCHIVED_CALLS = Counter(
    "tool_dispatcher_retention_archived_calls",
    "Calls archived, verified and removed from the database by this pass",
)
DROPPED_PARTITIONS = Counter(
    "tool_dispatcher_retention_dropped_partitions",
    "Days of execution_events archived and dropped by this pass",
)
DUE_CALLS = Gauge(
    "tool_dispatcher_retention_due_calls",
    "Calls due for the archive and still in the database when the pass ended",
)
LAST_SUCCESS = Gauge(
    "tool_dispatcher_retention_last_success_timestamp_seconds",
    "When a retention pass last ended without an error (Unix time)",
)
_ALL = (ARCHIVED_CALLS, DROPPED_PARTITIONS, DUE_CALLS, LAST_SUCCESS)
JOB = "tool-dispatcher-retention"


def push(url: str, *, succeeded: bool) -> None:
    """Push the retention metrics (and only them) as the job ``tool-dispatcher-retention``.
    A failed pass pushes all but the last success's time, which keeps the one the
    last successful pass pushed."""
    registry = CollectorRegistry()
    for collector in _ALL if succeeded else _ALL[:-1]:
        registry.register(collector)
    send = push_to_gateway if succeeded else pushadd_to_gateway
    send(url, job=JOB, registry=registry, timeout=10)
