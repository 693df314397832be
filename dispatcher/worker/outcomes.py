"""Point B: recording what the provider answered, for many calls in one transaction.

Each outcome is routed to its status (completed, accepted, failed, result_unknown), and
the whole batch is one fenced :func:`move_each`: ONE statement (the UPDATE, its events
and their outbox rows), whatever the mix, with one event per call. Only a reconciler's
re-send that got a final answer takes a second step (``accepted -> confirmed``: there
is no ``dispatching -> confirmed``), two statements more for the batch. Each call is
fenced by this worker's lease and the version its claim took: a call whose fence fails
was taken over (its lease lapsed and the recovery sweep or another worker moved it),
and what this worker saw of it is not recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from sqlalchemy import func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import tool_calls
from dispatcher.ledger.events import EventType
from dispatcher.ledger.leases import LEASE_RELEASED
from dispatcher.ledger.messages import DispatchCommand, Producer, enqueue
from dispatcher.ledger.pauses import not_paused
from dispatcher.ledger.routed import Divert, Route, RoutedMove, move_each
from dispatcher.ledger.transitions import BulkMove, Moved, move_many
from dispatcher.provider.client import OutcomeKind, ProviderOutcome
from dispatcher.settings import Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.states import ReconciliationStatus, VerificationStatus
from dispatcher.worker.claims import Claim, by_capability, seconds_of


@dataclass(frozen=True, slots=True)
class Sent:
    """A claimed call and what its provider answered."""

    claim: Claim
    outcome: ProviderOutcome


class _Class(Enum):
    COMPLETED = auto()
    ACCEPTED = auto()
    FAILED = auto()
    UNKNOWN = auto()
    SETTLED = auto()
    """A re-sent call's final answer: ``dispatching -> accepted -> confirmed``."""
    HELD = auto()
    """A circuit breaker stopped its attempts and none reached the provider: back to
    ``authorized``, to be sent when the breaker closes (its capability is paused)."""


def _class_of(sent: Sent) -> _Class:
    kind, claim = sent.outcome.kind, sent.claim
    if claim.settles:
        if kind is OutcomeKind.COMPLETED or (
            kind is OutcomeKind.FAILED and sent.outcome.http_status is not None
        ):
            return _Class.SETTLED
        if kind is OutcomeKind.NOT_SENT:
            # The re-send never reached the provider: still in doubt, look again later.
            return _Class.UNKNOWN
    if sent.outcome.held or _waits_for_breaker(sent):
        return _Class.HELD
    if kind is OutcomeKind.COMPLETED:
        return _Class.COMPLETED
    if kind is OutcomeKind.ACCEPTED:
        return _Class.ACCEPTED
    if kind in (OutcomeKind.FAILED, OutcomeKind.NOT_SENT):
        return _Class.FAILED
    return _Class.UNKNOWN


def _waits_for_breaker(sent: Sent) -> bool:
    """A call of a capability with a breaker that spent its attempts, none of which
    reached the provider: the provider is unreachable, which is the breaker's to judge,
    not a failure of this call. It waits in ``authorized`` (for the breaker's pause and
    resume, or the redrive), up to as many claims as its retry policy has attempts,
    then fails as it would without a breaker."""
    claim, outcome = sent.claim, sent.outcome
    breaker = claim.capability.breaker
    return (
        breaker is not None
        and outcome.kind is OutcomeKind.NOT_SENT
        and outcome.failure in breaker.counts
        and claim.dispatch_attempts < claim.capability.retry.max_attempts
    )


def _evidence(outcome: ProviderOutcome) -> dict[str, Any]:
    """What the provider's answer was, in the outcome's event. A field without a value is
    left out rather than written as null: most outcomes have no error, and every event
    is kept as long as its call (the schemas in docs/events allow either)."""
    found = {
        "httpStatus": outcome.http_status,
        "attempts": outcome.attempts,
        "externalRequestId": outcome.external_request_id,
        "error": outcome.error,
    }
    return {name: value for name, value in found.items() if value is not None}


def _verified_failure(outcome: ProviderOutcome) -> VerificationStatus:
    # Only a provider's own answer confirms a failure; exhausted connection attempts
    # prove nothing reached it, which is "not observed".
    return (
        VerificationStatus.CONFIRMED_FAILURE
        if outcome.http_status
        else VerificationStatus.NOT_OBSERVED
    )


def _target_of(cls: _Class) -> S:
    # A re-send's final answer passes through `accepted` (dispatching -> confirmed is
    # not a transition): the settling step follows in the same transaction.
    return {
        _Class.COMPLETED: S.COMPLETED,
        _Class.ACCEPTED: S.ACCEPTED,
        _Class.FAILED: S.FAILED,
        _Class.UNKNOWN: S.RESULT_UNKNOWN,
        _Class.SETTLED: S.ACCEPTED,
        _Class.HELD: S.AUTHORIZED,
    }[cls]


def _values(sent: Sent, target: S) -> dict[str, Any]:
    """The columns of one call that its outcome gives (the rest are its route's)."""
    # Kept when the answer names none.
    values: dict[str, Any] = {
        "external_request_id": sent.outcome.external_request_id or sent.claim.external_request_id
    }
    if target is S.COMPLETED:
        values["result"] = sent.outcome.result
        values["verification_status"] = VerificationStatus.CONFIRMED_SUCCESS.value
    elif target is S.FAILED:
        values["result"] = sent.outcome.result
        values["last_error"] = sent.outcome.error
        values["verification_status"] = _verified_failure(sent.outcome).value
    elif target in (S.RESULT_UNKNOWN, S.AUTHORIZED):
        values["last_error"] = sent.outcome.error
    return values


def _routes(items: Iterable[Sent]) -> dict[S, Route]:
    """What each target writes besides a call's own values. Every route is always
    given, so the statement's text is one whatever the batch holds."""
    now = func.now()
    follow_up = {
        **_follow_up(items),
        "verification_status": VerificationStatus.PENDING.value,
    }
    return {
        # Still stamped `accepted_at`, as when a success passed through `accepted`.
        S.COMPLETED: Route(
            EventType.TOOL_CALL_COMPLETED,
            ("external_request_id", "result", "verification_status"),
            {"accepted_at": now, "completed_at": now},
        ),
        # A re-send's answer too: its settling step overwrites the follow-up.
        S.ACCEPTED: Route(
            EventType.TOOL_CALL_ACCEPTED,
            ("external_request_id",),
            {**follow_up, "accepted_at": now},
        ),
        S.FAILED: Route(
            EventType.TOOL_CALL_FAILED,
            ("external_request_id", "last_error", "result", "verification_status"),
            {"completed_at": now},
        ),
        S.RESULT_UNKNOWN: Route(
            EventType.TOOL_CALL_RESULT_UNKNOWN, ("external_request_id", "last_error"), follow_up
        ),
        # Held by a breaker: nothing reached the provider, so the call waits to be sent
        # again with its key; the breaker's pause holds it, and lifting the pause
        # re-drives it (dispatcher.worker.redrive), or, lifted already, it is sent again
        # at once (OutcomeRecorder._send_again_unless_paused).
        S.AUTHORIZED: Route(
            EventType.TOOL_CALL_REDISPATCHED, ("external_request_id", "last_error")
        ),
    }


# A call whose run was stopped while it was in flight must not end as `completed`: it
# stops at `accepted` for the reconciler, which sees the success and the compensation
# request and undoes the effect. Decided inside the fenced UPDATE, on the row it locks,
# so no SELECT ... FOR UPDATE is needed first: a stop that marked the call before
# holds the row lock until it commits, and the UPDATE waits for it and re-evaluates
# the row as committed (READ COMMITTED re-checks an updated row), mark included; a stop
# that comes later waits for this transaction and sees this outcome. No read-then-write
# gap is left for a stop to fall into.
_STOPPED_RUN = Divert(S.COMPLETED, S.ACCEPTED, tool_calls.c.compensation_requested_at.is_not(None))


@dataclass(frozen=True, slots=True)
class OutcomeRecorder:
    """Records outcomes for one lease owner, in the caller's transaction."""

    owner: str
    producer: Producer
    topics: Topics

    async def record(self, session: AsyncSession, sent: Sequence[Sent]) -> dict[tuple[str, str], S]:
        """The status recorded per call; a call missing from the result was taken over.

        One statement (the fenced UPDATE, its events and outbox rows) for the whole
        batch, whatever its outcomes; a re-send's settlement adds its second step."""
        if not sent:
            return {}
        classes = {s.claim.key: _class_of(s) for s in sent}
        moved = await move_each(
            session,
            [self._move(s, _target_of(classes[s.claim.key])) for s in sent],
            expected=S.DISPATCHING,
            routes=_routes(sent),
            producer=self.producer,
            lease_owner=self.owner,
            fields=LEASE_RELEASED,
            divert=_STOPPED_RUN,
            topics=self.topics,
        )
        recorded = {(m.row.tenant, m.row.tool_call_id): S(m.row.status) for m in moved}
        by_gate = {
            s.claim.key for s in sent if classes[s.claim.key] is _Class.HELD and s.outcome.held
        }
        await self._send_again_unless_paused(
            session, [m for m in moved if (m.row.tenant, m.row.tool_call_id) in by_gate]
        )
        settling = [
            m for m in moved if classes[(m.row.tenant, m.row.tool_call_id)] is _Class.SETTLED
        ]
        if settling:
            by_key = {s.claim.key: s for s in sent}
            recorded.update(
                ((m.row.tenant, m.row.tool_call_id), S.CONFIRMED)
                for m in await self._finish(session, settling, by_key)
            )
        return recorded

    async def _send_again_unless_paused(self, session: AsyncSession, held: list[Moved]) -> None:
        """A new dispatch command for each call the gate held whose capability is not
        paused any more: this worker's view of the breaker was stale (the breaker closed
        while the call's attempts waited, as after a retry backoff longer than the
        cool-down), and the resume's drain, which writes again the commands of the calls
        authorized before the resume, does not see a call recorded back after it.

        A resume not yet committed when this reads the pauses is timed after its commit
        (:func:`dispatcher.ledger.pauses.after_resume`), so after this transaction began:
        the drain finds the call then. A call still paused waits for that drain."""
        if not held:
            return
        events = {(m.row.tenant, m.row.tool_call_id): m.event_id for m in held}
        rows = await session.execute(
            select(tool_calls).where(
                tuple_(tool_calls.c.tenant, tool_calls.c.tool_call_id).in_(list(events)),
                not_paused(tool_calls),
            )
        )
        await enqueue(
            session,
            [
                DispatchCommand.build(
                    r._mapping,
                    producer=self.producer,
                    causation_id=events[(r.tenant, r.tool_call_id)],
                ).to_outbox_row(self.topics)
                for r in rows
            ],
        )

    def _move(self, sent: Sent, target: S) -> RoutedMove:
        """``dispatching -> target``, fenced by this owner's lease and the claim's
        version; the event names the claim this outcome ends, as its dispatching event
        named it."""
        claim = sent.claim
        return RoutedMove(
            BulkMove(
                claim.tool_call_id,
                claim.version,
                _values(sent, target),
                {**_evidence(sent.outcome), "worker": self.owner, "claimVersion": claim.version},
                tenant=claim.tenant,
            ),
            target,
            claim.context,
        )

    async def _finish(
        self, session: AsyncSession, accepted: list[Moved], by_key: Mapping[tuple[str, str], Sent]
    ) -> list[Moved]:
        """A re-send's second step: ``accepted -> confirmed``."""
        # Same transaction, rows already locked by the first step: the version that step
        # gave each row fences the second (the lease is released by then).
        done = await move_many(
            session,
            [
                BulkMove(
                    m.row.tool_call_id,
                    m.row.version,
                    _settlement(by_key[(m.row.tenant, m.row.tool_call_id)]),
                    _evidence(by_key[(m.row.tenant, m.row.tool_call_id)].outcome),
                    tenant=m.row.tenant,
                )
                for m in accepted
            ],
            expected=S.ACCEPTED,
            target=S.CONFIRMED,
            event_type=EventType.TOOL_CALL_CONFIRMED,
            producer=self.producer,
            topics=self.topics,
            lease_owner=None,
            fields={
                "completed_at": func.now(),
                "reconciliation_status": ReconciliationStatus.SETTLED.value,
                "next_reconcile_at": None,
            },
        )
        if len(done) != len(accepted):
            raise RuntimeError("a call locked by this transaction moved under it")
        return done


def _settlement(sent: Sent) -> dict[str, Any]:
    succeeded = sent.outcome.kind is OutcomeKind.COMPLETED
    return {
        "result": sent.outcome.result,
        "last_error": None if succeeded else sent.outcome.error,
        "verification_status": (
            VerificationStatus.CONFIRMED_SUCCESS
            if succeeded
            else VerificationStatus.CONFIRMED_FAILURE
        ).value,
    }


def _follow_up(items: Iterable[Sent]) -> dict[str, Any]:
    """The reconciler looks at the call after its capability's initial delay."""
    delays = by_capability(
        "reconcile_delays",
        {s.claim.capability.id: s.claim.capability.reconcile.initial_delay_seconds for s in items},
    )
    return {
        "reconciliation_status": ReconciliationStatus.PENDING.value,
        "next_reconcile_at": func.now() + seconds_of(delays),
    }
