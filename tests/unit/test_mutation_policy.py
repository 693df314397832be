"""The reason of each verdict, which is what an operator reads on the escalation and in
``last_error``, and the edges of the in-flight wait: mutants of ``reconciler/policy.py``
that the decision-table tests let live
(``python -m bench.mutation --module reconciler/policy.py``)."""

from __future__ import annotations

import pytest

from dispatcher.capabilities import ReconcilePolicy
from dispatcher.states import ExecutionStatus as S
from reconciler.policy import Decision, Observation, Situation, Verdict, decide

Obs, D = Observation, Decision


def unknown(age: float = 5, *, stopped: bool = False, **kw: int | bool) -> Situation:
    return Situation(
        S.RESULT_UNKNOWN,
        attempts=int(kw.pop("attempts", 0)),
        redispatches=int(kw.pop("redispatches", 0)),
        age_seconds=age,
        compensation_requested=stopped,
        **kw,  # type: ignore[arg-type]
    )


DEFAULT = ReconcilePolicy()
NO_RESEND = ReconcilePolicy(on_not_found="confirm_failure")
RESEND_FAILED = ReconcilePolicy(on_failed="redispatch")
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
