"""The pure decision table (provider answer x policy -> decision) and the backoff."""

from __future__ import annotations

import pytest

from dispatcher.capabilities import ReconcilePolicy
from dispatcher.states import ExecutionStatus as S
from reconciler.policy import (
    Decision,
    Observation,
    Situation,
    backoff_seconds,
    decide,
)

Obs, D = Observation, Decision
FRESH = Situation(S.RESULT_UNKNOWN, attempts=0, redispatches=0, age_seconds=5)
STOPPED = Situation(
    S.RESULT_UNKNOWN, attempts=0, redispatches=0, age_seconds=5, compensation_requested=True
)
# Past the default inFlightSeconds (30): a request sent then can no longer arrive.
SETTLED_FRESH = Situation(S.RESULT_UNKNOWN, attempts=0, redispatches=0, age_seconds=31)
SETTLED_STOPPED = Situation(
    S.RESULT_UNKNOWN, attempts=0, redispatches=0, age_seconds=31, compensation_requested=True
)
ACCEPTED = Situation(S.ACCEPTED, attempts=0, redispatches=0, age_seconds=5)
DEFAULT = ReconcilePolicy()
NO_RESEND = ReconcilePolicy(on_not_found="confirm_failure")
RESEND_FAILED = ReconcilePolicy(on_failed="redispatch")


@pytest.mark.parametrize(
    ("seen", "situation", "policy", "expected"),
    [
        (Obs.SUCCEEDED, FRESH, DEFAULT, D.CONFIRM_SUCCESS),
        (Obs.SUCCEEDED, ACCEPTED, DEFAULT, D.CONFIRM_SUCCESS),
        (Obs.SUCCEEDED, STOPPED, DEFAULT, D.COMPENSATE),
        (Obs.PARTIAL, FRESH, DEFAULT, D.COMPENSATE),
        (Obs.FAILED, FRESH, DEFAULT, D.CONFIRM_FAILURE),
        (Obs.FAILED, FRESH, RESEND_FAILED, D.REDISPATCH),
        (Obs.FAILED, STOPPED, RESEND_FAILED, D.CONFIRM_FAILURE),
        (Obs.FAILED, ACCEPTED, RESEND_FAILED, D.CONFIRM_FAILURE),
        (Obs.NOT_FOUND, FRESH, DEFAULT, D.REDISPATCH),
        # No record while the request may still arrive proves nothing: look again.
        (Obs.NOT_FOUND, FRESH, NO_RESEND, D.RETRY),
        (Obs.NOT_FOUND, STOPPED, DEFAULT, D.RETRY),
        (Obs.NOT_FOUND, SETTLED_FRESH, NO_RESEND, D.CONFIRM_FAILURE),
        (Obs.NOT_FOUND, SETTLED_STOPPED, DEFAULT, D.CONFIRM_FAILURE),
        (Obs.NOT_FOUND, ACCEPTED, DEFAULT, D.RETRY),
        (Obs.PENDING, FRESH, DEFAULT, D.RETRY),
        (Obs.LOOKUP_FAILED, FRESH, DEFAULT, D.RETRY),
        (Obs.UNREADABLE, FRESH, DEFAULT, D.RETRY),
        (Obs.UNKNOWABLE, FRESH, DEFAULT, D.ESCALATE),
    ],
)
def test_decision_table(
    seen: Observation, situation: Situation, policy: ReconcilePolicy, expected: Decision
) -> None:
    assert decide(seen, situation, policy).decision is expected


def test_compensation_without_an_endpoint_escalates() -> None:
    cannot = Situation(S.RESULT_UNKNOWN, 0, 0, 5, compensation_requested=True, can_compensate=False)
    verdict = decide(Obs.SUCCEEDED, cannot, DEFAULT)
    assert verdict.decision is D.ESCALATE
    assert "no compensation" in verdict.reason


def test_no_resend_past_the_idempotency_window() -> None:
    old = Situation(S.RESULT_UNKNOWN, 0, 0, age_seconds=DEFAULT.idempotency_window_seconds)
    verdict = decide(Obs.NOT_FOUND, old, DEFAULT)
    assert verdict.decision is D.ESCALATE
    assert "idempotency window" in verdict.reason


def test_resends_are_bounded() -> None:
    policy = ReconcilePolicy(max_redispatches=2)
    assert decide(Obs.NOT_FOUND, Situation(S.RESULT_UNKNOWN, 0, 1, 5), policy).decision is (
        D.REDISPATCH
    )
    assert decide(Obs.NOT_FOUND, Situation(S.RESULT_UNKNOWN, 0, 2, 5), policy).decision is (
        D.ESCALATE
    )


@pytest.mark.parametrize("seen", [Obs.PENDING, Obs.LOOKUP_FAILED, Obs.UNREADABLE])
def test_retries_end_in_escalation_after_max_attempts(seen: Observation) -> None:
    policy = ReconcilePolicy(max_attempts=3)
    assert decide(seen, Situation(S.RESULT_UNKNOWN, 1, 0, 5), policy).decision is D.RETRY
    verdict = decide(seen, Situation(S.RESULT_UNKNOWN, 2, 0, 5), policy)
    assert verdict.decision is D.ESCALATE
    assert "after 3 attempt(s)" in verdict.reason


def test_retries_end_in_escalation_at_the_deadline() -> None:
    policy = ReconcilePolicy(deadline_seconds=60)
    assert decide(Obs.PENDING, Situation(S.ACCEPTED, 0, 0, 59), policy).decision is D.RETRY
    assert decide(Obs.PENDING, Situation(S.ACCEPTED, 0, 0, 60), policy).decision is D.ESCALATE


def test_backoff_doubles_from_the_initial_delay_up_to_the_cap() -> None:
    policy = ReconcilePolicy(initial_delay_seconds=1, max_delay_seconds=10)
    assert [backoff_seconds(n, policy) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert backoff_seconds(10_000, policy) == 10  # no overflow however long it goes on
