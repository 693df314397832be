"""No label value of the service's metrics is unbounded: each is one of its label's
enum values, or has the shape of a capability id, partition, route template or table
name, and none looks like the id of a call, run, approval or escalation.

The metric tests (tests/ledger, tests/worker, tests/control, tests/reconciler
``*_metrics`` / ``*_gauges``) run the same check after each of their tests, on the
samples the real facts left; here it runs on whatever this session left, and on
planted values to show it can fail."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter

from tests.fixtures import metrics
from tests.fixtures.metrics import bounded, unbounded_samples


def test_what_this_session_left_is_bounded() -> None:
    assert unbounded_samples() == []


@pytest.mark.parametrize(
    "label, value",
    [
        ("capability", "refund"),
        ("capability", "send-email"),
        ("from", "accepted|result_unknown"),
        ("to", "dispatching"),
        ("status", "4xx"),
        ("outcome", "validation_failed"),
        # An enum member or a template parameter that only looks like an id's prefix.
        ("outcome", "run_stopped"),
        ("route", "/v1/runs/{run_id}/events"),
        ("outcome", "taken_over"),
        ("partition", "3"),
        ("le", "0.005"),
        ("route", "/v1/tool-calls/{tool_call_id}"),
        ("table", "outbox"),
    ],
)
def test_bounded_values_pass(label: str, value: str) -> None:
    assert bounded(label, value, metrics._enum_values())


@pytest.mark.parametrize(
    "label, value",
    [
        ("capability", "tc-1e5de0dc92c0"),  # a call id
        ("capability", "443e1c92-e786-43a8-a2d3-95a62d2ad3d4"),
        ("route", "/v1/tool-calls/tc-61015252d4eb"),  # a path, not its template
        ("outcome", "apr_218d9dfa7e414685a628f21b0f3ea800"),
        ("to", "somewhere"),  # not a status
        ("from", "accepted|nowhere"),
        ("partition", "p-1"),
        ("tenant", "acme"),  # a label the catalogue does not have
    ],
)
def test_unbounded_values_are_caught(label: str, value: str) -> None:
    assert not bounded(label, value, metrics._enum_values())


def test_a_sample_with_a_call_id_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = CollectorRegistry()
    planted = Counter("tool_dispatcher_planted", "a planted one", ["capability"], registry=registry)
    planted.labels("tc-0123456789ab").inc()
    monkeypatch.setattr(metrics, "REGISTRY", registry)
    # Each of the counter's samples (_total, _created) carries the call id.
    assert {(label, value) for _, label, value in unbounded_samples()} == {
        ("capability", "tc-0123456789ab")
    }
