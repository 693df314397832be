"""Prometheus metrics of the dispatcher's processes: the API, the worker (and the
reconciler's re-sends through its executor), the approvals sweeper (default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

INTAKE_SUBMISSIONS = Counter(
    "tool_dispatcher_intake_submissions_total",
    "Tool-call submissions by outcome (created, replayed, or the error code)",
    ["outcome"],
)
HTTP_REQUEST_SECONDS = Histogram(
    "tool_dispatcher_http_request_seconds",
    "HTTP request latency by route template and status class",
    ["route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)

# Label values are bounded by construction: capabilities by the registry, statuses,
# rules and outcomes by their enums, partitions by the topic's configuration. Never a
# call, run or tenant id (tests/unit/test_metric_catalogue.py, docs/metrics.md).
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)

TRANSITIONS = Counter(
    "tool_dispatcher_transitions_total",
    "Status changes of calls by the statement that made them (from, to, capability)",
    ["from", "to", "capability"],
)
DISPATCH_SECONDS = Histogram(
    "tool_dispatcher_dispatch_seconds",
    "Provider request duration of one dispatch, retries included, by capability",
    ["capability"],
    buckets=_LATENCY_BUCKETS,
)
DISPATCH_OUTCOMES = Counter(
    "tool_dispatcher_dispatch_outcomes_total",
    "Provider outcome classes of dispatches, by capability",
    ["capability", "outcome"],
)
BREAKER_FAILURES = Counter(
    "tool_dispatcher_breaker_failures_total",
    "Failed provider attempts a capability's circuit breaker counted, by failure class",
    ["capability", "failure"],
)
BREAKER_TRANSITIONS = Counter(
    "tool_dispatcher_breaker_transitions_total",
    "Moves of a capability's circuit breaker, by the state entered (open, half_open, closed)",
    ["capability", "to"],
)
FENCED_OUTCOMES = Counter(
    "tool_dispatcher_fenced_outcomes_total",
    "Outcomes a worker saw but could not record: its lease was lost (a zombie)",
    ["capability"],
)
RECOVERIES = Counter(
    "tool_dispatcher_recoveries_total",
    "Calls taken over from a dead worker by the recovery sweep, by rule",
    ["rule", "capability"],
)
REDRIVES = Counter(
    "tool_dispatcher_redrives_total",
    "Dispatch commands written again for calls authorized too long without one",
    ["capability"],
)
CONSUMER_LAG = Gauge(
    "tool_dispatcher_worker_consumer_lag",
    "Dispatch commands behind the partition's high watermark, as of the last fetch",
    ["partition"],
)
APPROVAL_WAIT_SECONDS = Histogram(
    "tool_dispatcher_approval_wait_seconds",
    "From the approval's creation to its decision or expiry, by decision",
    ["decision"],
    buckets=_WAIT_BUCKETS,
)
APPROVAL_DECISIONS = Counter(
    "tool_dispatcher_approval_decisions_total",
    "Approvals closed, by decision (approved, rejected, expired)",
    ["decision"],
)
ESCALATIONS_OPENED = Counter(
    "tool_dispatcher_escalations_opened_total",
    "Escalations opened (a call handed to a human), by capability",
    ["capability"],
)

# Bus intake (dispatcher.bus). Labelled by request topic: topics are configured, one per
# tenant, so the series are as many as the routes.
BUS_RECORDS = Counter(
    "tool_dispatcher_bus_records_total",
    "Request records recorded by bus intake: accepted (a call, new or replayed) or"
    " refused (by problem code)",
    ["topic", "outcome", "code"],
)
BUS_DEAD_LETTERS = Counter(
    "tool_dispatcher_bus_dead_letters_total",
    "Unreadable request records copied to their dead-letter topic, by problem code",
    ["topic", "code"],
)
BUS_BATCH_RECORDS = Histogram(
    "tool_dispatcher_bus_batch_records",
    "Records in one recorded batch (one transaction)",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
)
BUS_PRODUCE_TO_COMMIT_SECONDS = Histogram(
    "tool_dispatcher_bus_produce_to_commit_seconds",
    "From a request record's timestamp (its producer's clock, or the broker's) to the"
    " database commit that recorded it",
    buckets=_LATENCY_BUCKETS,
)
BUS_NEW_LOGS = Counter(
    "tool_dispatcher_bus_new_logs_total",
    "Request partitions found to be a new log (the topic was deleted and made again, or"
    " the broker lost it) and recorded again from their beginning",
    ["topic"],
)
BUS_LAG = Gauge(
    "tool_dispatcher_bus_consumer_lag",
    "Request records behind the partition's high watermark, as of the last fetch",
    ["topic", "partition"],
)
BUS_PAUSED = Gauge(
    "tool_dispatcher_bus_paused_partitions",
    "Request partitions paused by bus intake, by reason (database, rate_limited)",
    ["reason"],
)

# Webhooks (dispatcher.webhooks): ``event`` is one of the seven event types, ``result``
# delivered (2xx), failed (an attempt to be retried) or dead (its attempts ran out).
WEBHOOK_ATTEMPTS = Counter(
    "tool_dispatcher_webhook_attempts_total",
    "Webhook delivery attempts by event type and result (delivered, failed, dead)",
    ["event", "result"],
)
WEBHOOK_NOTIFICATIONS = Counter(
    "tool_dispatcher_webhook_notifications_total",
    "Webhook notifications fanned out, by event type (deliveries: one per subscriber)",
    ["event"],
)
