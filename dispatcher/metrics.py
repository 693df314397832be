"""Prometheus metrics of the dispatcher process (default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

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
