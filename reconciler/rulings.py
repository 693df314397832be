"""What the reconciler rules for each call it looked at, as typed values.

:func:`rule` turns a call, its capability and the provider's answer into one of them
(pure: the policy's :class:`~reconciler.policy.Verdict` plus what recording it needs).
Two of them are work still to do, outside any transaction: a :class:`Redispatch` (send
the call again) and a :class:`Compensation` (ask the provider to undo the effect; its
reply is ruled by :func:`after_reversal`). The others are a :data:`Ruling`, recorded in
one transaction per batch (:class:`Rulings`, :mod:`reconciler.record`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, assert_never

from dispatcher.capabilities import Capability
from dispatcher.ledger.pauses import is_paused
from reconciler.due import DueCall
from reconciler.lookup import Answer, CompensationAnswer, Reversal, lookup_urls
from reconciler.policy import (
    Decision,
    Situation,
    Verdict,
    backoff_seconds,
    decide,
    retry_or_escalate,
)


@dataclass(frozen=True, slots=True)
class Settlement:
    """What settles one call: the provider's result, the request id it is known by,
    the error it ended with, and the evidence for it all."""

    call: DueCall
    evidence: Mapping[str, Any]
    result: Any = None
    external_request_id: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Confirmed:
    """The provider's answer is final: the effect happened (``succeeded``) or not."""

    settlement: Settlement
    succeeded: bool


@dataclass(frozen=True, slots=True)
class Compensated:
    """The effect happened and the provider undid it."""

    settlement: Settlement


@dataclass(frozen=True, slots=True)
class Retry:
    """A call to look at again after ``delay_seconds``."""

    call: DueCall
    delay_seconds: float
    evidence: Mapping[str, Any]
    error: str | None = None
    counted: bool = True
    """False for a look put off while the call's capability is paused."""


@dataclass(frozen=True, slots=True)
class Escalation:
    """A call nobody can settle automatically: why, and what the on-call engineer
    needs beyond the call's own history (:func:`dossier`)."""

    call: DueCall
    reason: str
    dossier: Mapping[str, Any]


Ruling = Confirmed | Compensated | Retry | Escalation
"""A ruling ready to be recorded."""


@dataclass(frozen=True, slots=True)
class Redispatch:
    """A call to send again with its own key (the reconciler's re-send)."""

    call: DueCall
    capability: Capability
    evidence: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Compensation:
    """A call whose effect the provider is to undo (its answer names the effect)."""

    call: DueCall
    capability: Capability
    answer: Answer
    evidence: Mapping[str, Any]


@dataclass
class Rulings:
    """A batch's rulings, grouped by how they are recorded."""

    successes: list[Settlement] = field(default_factory=list)
    failures: list[Settlement] = field(default_factory=list)
    retries: list[Retry] = field(default_factory=list)
    compensated: list[Settlement] = field(default_factory=list)
    escalations: list[Escalation] = field(default_factory=list)

    def put(self, ruling: Ruling) -> None:
        match ruling:
            case Confirmed(settlement, succeeded=True):
                self.successes.append(settlement)
            case Confirmed(settlement):  # refuted: the effect did not happen
                self.failures.append(settlement)
            case Compensated(settlement):
                self.compensated.append(settlement)
            case Retry():
                self.retries.append(ruling)
            case Escalation():
                self.escalations.append(ruling)
            case _:
                assert_never(ruling)


def situation(call: DueCall, capability: Capability | None) -> Situation:
    """What the policy knows of ``call`` besides the provider's answer."""
    return Situation(
        status=call.status,
        attempts=call.reconcile_attempts,
        redispatches=call.redispatches,
        age_seconds=call.age_seconds,
        compensation_requested=call.compensation_requested,
        can_compensate=capability is not None and capability.compensation is not None,
    )


def verdict_of(call: DueCall, capability: Capability | None, answer: Answer) -> Verdict:
    if capability is None:
        return Verdict(Decision.ESCALATE, f"capability {call.capability_id!r} not registered")
    return decide(answer.observation, situation(call, capability), capability.reconcile)


def rule(
    call: DueCall, capability: Capability | None, answer: Answer
) -> Ruling | Redispatch | Compensation:
    """The policy's verdict on ``call`` given ``answer``, with its evidence."""
    verdict = verdict_of(call, capability, answer)
    evidence = {
        "decision": verdict.decision.value,
        "reason": verdict.reason,
        "attempt": call.reconcile_attempts + 1,
        "lookup": answer.evidence(),
    }
    decision = verdict.decision
    if decision is Decision.REDISPATCH and capability is not None:
        return Redispatch(call, capability, evidence)
    if decision is Decision.COMPENSATE and capability is not None:
        return Compensation(call, capability, answer, evidence)
    if decision is Decision.CONFIRM_SUCCESS:
        settled = Settlement(call, evidence, answer.result, answer.external_request_id)
        return Confirmed(settled, succeeded=True)
    if decision is Decision.CONFIRM_FAILURE:
        error = answer.error or f"provider reports {answer.observation.value}"
        settled = Settlement(call, evidence, answer.result, answer.external_request_id, error)
        return Confirmed(settled, succeeded=False)
    if decision is Decision.RETRY and capability is not None:
        delay = backoff_seconds(call.reconcile_attempts + 1, capability.reconcile)
        return Retry(call, delay, evidence, answer.error)
    return Escalation(call, verdict.reason, dossier(call, capability, answer))


def unaddressed(compensation: Compensation) -> Escalation:
    """A reversal with no request to address it to: the answer named none, nor did
    the call."""
    call, capability, answer = compensation.call, compensation.capability, compensation.answer
    why = "compensation needed, but the provider's request id is unknown"
    return Escalation(call, why, dossier(call, capability, answer))


def after_reversal(
    compensation: Compensation, reply: CompensationAnswer, external_id: str
) -> Compensated | Retry | Escalation:
    """What the provider's ``reply`` to the reversal of ``external_id`` rules."""
    call, capability, answer = compensation.call, compensation.capability, compensation.answer
    evidence = {**compensation.evidence, "compensation": reply.evidence()}
    if reply.outcome is Reversal.DONE:
        result = {"effect": answer.result, "reversal": reply.body}
        return Compensated(Settlement(call, evidence, result, external_id))
    if reply.outcome is Reversal.REFUSED:
        refused = {**dossier(call, capability, answer), "compensation": evidence}
        return Escalation(call, f"the compensation failed: {reply.error}", refused)
    verdict = retry_or_escalate(
        situation(call, capability),
        capability.reconcile,
        "the compensation got no definitive answer",
    )
    if verdict.decision is Decision.ESCALATE:
        unanswered = {**dossier(call, capability, answer), "compensation": evidence}
        return Escalation(call, verdict.reason, unanswered)
    delay = backoff_seconds(call.reconcile_attempts + 1, capability.reconcile)
    return Retry(call, delay, evidence, reply.error)


def dossier(call: DueCall, capability: Capability | None, answer: Answer) -> dict[str, Any]:
    """What the on-call engineer needs beyond the call's own history."""
    return {
        "lastAnswer": answer.evidence(),
        "providerLookup": [
            f"GET {url}"
            for url in lookup_urls(
                capability,
                answer.external_request_id or call.external_request_id,
                call.provider_key,
            )
        ]
        if capability is not None
        else [],
        "policy": capability.reconcile.model_dump(by_alias=True, mode="json")
        if capability is not None
        else None,
    }


def held_if_paused(
    ruling: Ruling | Redispatch | Compensation, paused: frozenset[tuple[str, str]]
) -> Ruling | Redispatch | Compensation:
    """A call whose capability is paused (for its tenant or every tenant): a re-send or
    a compensation (both would reach the provider that is down) is put off until the
    capability resumes, and so is a look that settled nothing; neither counts toward the
    policy's attempts, so an outage does not escalate the calls it holds. What a lookup
    settles goes on."""
    if not isinstance(ruling, Redispatch | Compensation | Retry):
        return ruling
    call = ruling.call
    if not is_paused(paused, call.capability_id, call.tenant):
        return ruling
    if isinstance(ruling, Retry):
        return replace(ruling, counted=False)
    evidence = {**ruling.evidence, "heldBy": "capability paused"}
    delay = ruling.capability.reconcile.max_delay_seconds
    return Retry(call, delay, evidence, counted=False)
