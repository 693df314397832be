"""The pure decision table (provider answer x policy -> decision), the reason each
verdict gives (what an operator reads on the escalation and in ``last_error``), the
edges of the in-flight wait, and the backoff."""

from __future__ import annotations

import pytest

from dispatcher.capabilities import ReconcilePolicy
from dispatcher.states import ExecutionStatus as S
from reconciler.policy import (
    Decision,
    Observation,
    Situation,
    Verdict,
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


def unknown(age: float = 5, *, stopped: bool = False, **kw: int | bool) -> Situation:
    return Situation(
        S.RESULT_UNKNOWN,
        attempts=int(kw.pop("attempts", 0)),
        redispatches=int(kw.pop("redispatches", 0)),
        age_seconds=age,
        compensation_requested=stopped,
        **kw,  # type: ignore[arg-type]
    )


NO_RECORD = "the provider has no record"
STOPPED_NO_RECORD = NO_RECORD + " and compensation was requested: not re-sent"


@pytest.mark.parametrize(
    ("seen", "situation", "policy", "verdict"),
    [
        (
            Obs.SUCCEEDED,
            unknown(),
            DEFAULT,
            Verdict(D.CONFIRM_SUCCESS, "the provider reports success"),
        ),
        (
            Obs.SUCCEEDED,
            unknown(stopped=True),
            DEFAULT,
            Verdict(D.COMPENSATE, "the effect happened but compensation was requested"),
        ),
        (
            Obs.PARTIAL,
            unknown(),
            DEFAULT,
            Verdict(D.COMPENSATE, "the provider reports a partial effect"),
        ),
        (
            Obs.PARTIAL,
            unknown(can_compensate=False),
            DEFAULT,
            Verdict(
                D.ESCALATE,
                "the provider reports a partial effect, and the capability has no compensation",
            ),
        ),
        (
            Obs.FAILED,
            unknown(),
            DEFAULT,
            Verdict(D.CONFIRM_FAILURE, "the provider reports failure"),
        ),
        (
            Obs.FAILED,
            unknown(),
            RESEND_FAILED,
            Verdict(D.REDISPATCH, "the provider reports failure: sending again with the same key"),
        ),
        (
            Obs.FAILED,
            unknown(redispatches=2),
            RESEND_FAILED,
            Verdict(
                D.ESCALATE, "the provider reports failure after 2 re-send(s) with the same key"
            ),
        ),
        (
            Obs.NOT_FOUND,
            unknown(),
            DEFAULT,
            Verdict(D.REDISPATCH, "the provider has no record: sending again with the same key"),
        ),
        (
            Obs.NOT_FOUND,
            unknown(86400),
            DEFAULT,
            Verdict(
                D.ESCALATE,
                "the provider has no record, and the provider's idempotency window has passed:"
                " re-sending is unsafe",
            ),
        ),
        (Obs.NOT_FOUND, unknown(31), NO_RESEND, Verdict(D.CONFIRM_FAILURE, NO_RECORD)),
        (
            Obs.NOT_FOUND,
            unknown(31, stopped=True),
            DEFAULT,
            Verdict(D.CONFIRM_FAILURE, STOPPED_NO_RECORD),
        ),
        (
            Obs.NOT_FOUND,
            unknown(29, stopped=True),
            DEFAULT,
            Verdict(D.RETRY, STOPPED_NO_RECORD + " yet, and the request may still arrive"),
        ),
        (
            Obs.NOT_FOUND,
            unknown(29),
            NO_RESEND,
            Verdict(D.RETRY, NO_RECORD + " yet, and the request may still arrive"),
        ),
        # At exactly inFlightSeconds the request can no longer arrive.
        (Obs.NOT_FOUND, unknown(30), NO_RESEND, Verdict(D.CONFIRM_FAILURE, NO_RECORD)),
        (
            Obs.UNKNOWABLE,
            unknown(),
            DEFAULT,
            Verdict(D.ESCALATE, "the provider cannot be asked about this request"),
        ),
        (
            Obs.PENDING,
            unknown(),
            DEFAULT,
            Verdict(D.RETRY, "the provider reports the request pending"),
        ),
        (Obs.LOOKUP_FAILED, unknown(), DEFAULT, Verdict(D.RETRY, "the lookup failed")),
        (
            Obs.UNREADABLE,
            unknown(),
            DEFAULT,
            Verdict(D.RETRY, "the provider's answer cannot be mapped to an outcome"),
        ),
        (
            Obs.PENDING,
            unknown(attempts=9),
            DEFAULT,
            Verdict(
                D.ESCALATE, "the provider reports the request pending; gave up after 10 attempt(s)"
            ),
        ),
        (
            Obs.PENDING,
            unknown(60),
            ReconcilePolicy(deadline_seconds=60),
            Verdict(
                D.ESCALATE,
                "the provider reports the request pending; the reconcile deadline has passed",
            ),
        ),
        (
            Obs.NOT_FOUND,
            Situation(S.ACCEPTED, attempts=0, redispatches=0, age_seconds=5),
            DEFAULT,
            Verdict(D.RETRY, "the provider accepted the request but has no record of it"),
        ),
    ],
)
def test_each_verdict_says_why(
    seen: Observation, situation: Situation, policy: ReconcilePolicy, verdict: Verdict
) -> None:
    assert decide(seen, situation, policy) == verdict
