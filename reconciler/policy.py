"""What to do with a call in doubt, given what the provider said: pure functions.

The decision table (``redispatch`` means "send again with the SAME idempotency key",
safe only inside the provider's idempotency window and at most ``maxRedispatches``
times; past either limit it becomes ``escalate``)::

    provider says        compensation requested?    decision
    -------------------  -------------------------  ----------------------------------
    succeeded            no                         confirm_success
    succeeded            yes                        compensate
    partial effect       either                     compensate
    failed               no                         onFailed: confirm_failure | redispatch
    failed               yes                        confirm_failure
    no record (404)      no                         onNotFound: redispatch | confirm_failure*
    no record (404)      yes                        confirm_failure* (never re-sent)
    no record, accepted  either                     retry  (the provider took it: keep asking)
    pending              either                     retry
    lookup failed        either                     retry  (timeout, 5xx, connection error)
    unreadable answer    either                     retry
    cannot be looked up  either                     escalate (no provider id, and no lookup
                                                    by key or past the key's window)

``*``: only once ``inFlightSeconds`` have passed since the dispatch; before that the
request may still arrive, so the answer is ``retry``. ``compensate`` without a
compensation endpoint is ``escalate``. ``retry`` becomes
``escalate`` (verification ``inconclusive``) once the capability's ``maxAttempts``
lookups are spent or its ``deadlineSeconds`` passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dispatcher.capabilities import ReconcilePolicy
from dispatcher.states import ExecutionStatus as S


class Observation(StrEnum):
    """What one look at the provider showed."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PENDING = "pending"
    PARTIAL = "partial"
    """Part of the effect happened; it must be undone."""
    NOT_FOUND = "not_found"
    LOOKUP_FAILED = "lookup_failed"
    """No answer: timeout, connection error, 5xx, throttling."""
    UNREADABLE = "unreadable"
    """An answer the policy cannot map to an outcome."""
    UNKNOWABLE = "unknowable"
    """The provider cannot be asked: no id, and no usable lookup by key."""


class Decision(StrEnum):
    CONFIRM_SUCCESS = "confirm_success"
    CONFIRM_FAILURE = "confirm_failure"
    COMPENSATE = "compensate"
    REDISPATCH = "redispatch"
    RETRY = "retry"
    ESCALATE = "escalate"


@dataclass(frozen=True, slots=True)
class Situation:
    """What the reconciler knows about the call besides the provider's answer."""

    status: S
    """``result_unknown`` or ``accepted``."""
    attempts: int
    """Lookups made before this one."""
    redispatches: int
    age_seconds: float
    """Since the call was first dispatched (or created, if never)."""
    compensation_requested: bool = False
    can_compensate: bool = True


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    reason: str


def decide(seen: Observation, situation: Situation, policy: ReconcilePolicy) -> Verdict:
    """The decision for one observation (see the module's table)."""
    if seen is Observation.SUCCEEDED:
        if situation.compensation_requested:
            return _compensate(situation, "the effect happened but compensation was requested")
        return Verdict(Decision.CONFIRM_SUCCESS, "the provider reports success")
    if seen is Observation.PARTIAL:
        return _compensate(situation, "the provider reports a partial effect")
    if seen is Observation.FAILED:
        if (
            policy.on_failed == "redispatch"
            and not situation.compensation_requested
            and situation.status is S.RESULT_UNKNOWN
        ):
            return _redispatch(situation, policy, "the provider reports failure")
        return Verdict(Decision.CONFIRM_FAILURE, "the provider reports failure")
    if seen is Observation.NOT_FOUND and situation.status is S.RESULT_UNKNOWN:
        if situation.compensation_requested or policy.on_not_found == "confirm_failure":
            why = "the provider has no record" + (
                " and compensation was requested: not re-sent"
                if situation.compensation_requested
                else ""
            )
            if situation.age_seconds < policy.in_flight_seconds:
                # A stalled request can still land after this lookup; taking the
                # absence as the failure now would record a guess.
                return retry_or_escalate(
                    situation, policy, f"{why} yet, and the request may still arrive"
                )
            return Verdict(Decision.CONFIRM_FAILURE, why)
        return _redispatch(situation, policy, "the provider has no record")
    if seen is Observation.UNKNOWABLE:
        return Verdict(Decision.ESCALATE, "the provider cannot be asked about this request")
    why = {
        Observation.PENDING: "the provider reports the request pending",
        Observation.NOT_FOUND: "the provider accepted the request but has no record of it",
        Observation.LOOKUP_FAILED: "the lookup failed",
        Observation.UNREADABLE: "the provider's answer cannot be mapped to an outcome",
    }[seen]
    return retry_or_escalate(situation, policy, why)


def backoff_seconds(attempts: int, policy: ReconcilePolicy) -> float:
    """The wait after the ``attempts``-th failed lookup (1-based): the initial delay,
    doubling, capped. Deterministic: calls in doubt are spread out by when they
    became unknown, and a thundering herd only costs cheap lookups."""
    exponent = min(max(attempts - 1, 0), 60)
    return float(min(policy.max_delay_seconds, policy.initial_delay_seconds * 2.0**exponent))


def _compensate(situation: Situation, why: str) -> Verdict:
    if not situation.can_compensate:
        return Verdict(Decision.ESCALATE, f"{why}, and the capability has no compensation")
    return Verdict(Decision.COMPENSATE, why)


def _redispatch(situation: Situation, policy: ReconcilePolicy, why: str) -> Verdict:
    if situation.age_seconds >= policy.idempotency_window_seconds:
        return Verdict(
            Decision.ESCALATE,
            f"{why}, and the provider's idempotency window has passed: re-sending is unsafe",
        )
    if situation.redispatches >= policy.max_redispatches:
        return Verdict(
            Decision.ESCALATE, f"{why} after {situation.redispatches} re-send(s) with the same key"
        )
    return Verdict(Decision.REDISPATCH, f"{why}: sending again with the same key")


def retry_or_escalate(situation: Situation, policy: ReconcilePolicy, why: str) -> Verdict:
    """Look again later, unless the attempts or the deadline are spent."""
    made = situation.attempts + 1
    if made >= policy.max_attempts:
        return Verdict(Decision.ESCALATE, f"{why}; gave up after {made} attempt(s)")
    if policy.deadline_seconds is not None and situation.age_seconds >= policy.deadline_seconds:
        return Verdict(Decision.ESCALATE, f"{why}; the reconcile deadline has passed")
    return Verdict(Decision.RETRY, why)
