"""Point B: recording what the provider answered, for many calls in one transaction.

Outcomes are grouped by how they are recorded (completed, accepted, failed, unknown,
settled by a re-send); each group is one fenced :func:`move_many` (two for the
classes that pass through ``accepted``), so a batch costs a handful of statements
whatever its size. Each call is fenced by this worker's lease and the version its
claim took: a call whose fence fails was taken over (its lease lapsed and the recovery
sweep or another worker moved it), and what this worker saw of it is not recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from sqlalchemy import func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import tool_calls
from dispatcher.ledger.events import EventType
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.transitions import BulkMove, Moved, move_many
from dispatcher.provider.client import OutcomeKind, ProviderOutcome
from dispatcher.settings import Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.states import ReconciliationStatus, VerificationStatus
from dispatcher.worker.claims import Claim, by_capability, seconds_of

_RELEASED: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}


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
    if kind is OutcomeKind.COMPLETED:
        return _Class.COMPLETED
    if kind is OutcomeKind.ACCEPTED:
        return _Class.ACCEPTED
    if kind in (OutcomeKind.FAILED, OutcomeKind.NOT_SENT):
        return _Class.FAILED
    return _Class.UNKNOWN


def _evidence(outcome: ProviderOutcome) -> dict[str, Any]:
    return {
        "httpStatus": outcome.http_status,
        "attempts": outcome.attempts,
        "externalRequestId": outcome.external_request_id,
        "error": outcome.error,
    }


def _verified_failure(outcome: ProviderOutcome) -> VerificationStatus:
    # Only a provider's own answer confirms a failure; exhausted connection attempts
    # prove nothing reached it, which is "not observed".
    return (
        VerificationStatus.CONFIRMED_FAILURE
        if outcome.http_status
        else VerificationStatus.NOT_OBSERVED
    )


@dataclass(frozen=True, slots=True)
class OutcomeRecorder:
    """Records outcomes for one lease owner, in the caller's transaction."""

    owner: str
    producer: Producer
    topics: Topics

    async def record(self, session: AsyncSession, sent: Sequence[Sent]) -> dict[tuple[str, str], S]:
        """The status recorded per call; a call missing from the result was taken over."""
        groups: dict[_Class, list[Sent]] = {}
        for item in sent:
            groups.setdefault(_class_of(item), []).append(item)
        if _Class.COMPLETED in groups:
            # A call whose run was stopped while it was in flight must not end as
            # `completed`: it stops at `accepted` for the reconciler, which sees the
            # success and the compensation request and undoes the effect. Locked here so
            # a concurrent stop sees either this outcome or marks the call first.
            undo = {
                (r.tenant, r.tool_call_id)
                for r in (
                    await session.execute(
                        select(tool_calls.c.tenant, tool_calls.c.tool_call_id)
                        .where(
                            tuple_(tool_calls.c.tenant, tool_calls.c.tool_call_id).in_(
                                [i.claim.key for i in groups[_Class.COMPLETED]]
                            ),
                            tool_calls.c.compensation_requested_at.is_not(None),
                        )
                        .with_for_update()
                    )
                ).all()
            }
            if undo:
                groups.setdefault(_Class.ACCEPTED, []).extend(
                    i for i in groups[_Class.COMPLETED] if i.claim.key in undo
                )
                groups[_Class.COMPLETED] = [
                    i for i in groups[_Class.COMPLETED] if i.claim.key not in undo
                ]
        recorded: dict[tuple[str, str], S] = {}
        for cls in _Class:  # a fixed order of statements, whatever the batch holds
            if not groups.get(cls):
                continue
            status, moved = await self._write(session, cls, groups[cls])
            recorded.update(((m.row.tenant, m.row.tool_call_id), status) for m in moved)
        return recorded

    async def _write(
        self, session: AsyncSession, cls: _Class, items: list[Sent]
    ) -> tuple[S, list[Moved]]:
        now = func.now()
        if cls is _Class.FAILED:
            return S.FAILED, await self._leave_dispatching(
                session,
                items,
                S.FAILED,
                EventType.TOOL_CALL_FAILED,
                lambda s: {
                    "last_error": s.outcome.error,
                    "result": s.outcome.result,
                    "verification_status": _verified_failure(s.outcome).value,
                },
                {"completed_at": now},
            )
        if cls is _Class.UNKNOWN:
            return S.RESULT_UNKNOWN, await self._leave_dispatching(
                session,
                items,
                S.RESULT_UNKNOWN,
                EventType.TOOL_CALL_RESULT_UNKNOWN,
                lambda s: {"last_error": s.outcome.error},
                {**_follow_up(items), "verification_status": VerificationStatus.PENDING.value},
            )
        if cls is _Class.ACCEPTED:
            return S.ACCEPTED, await self._leave_dispatching(
                session,
                items,
                S.ACCEPTED,
                EventType.TOOL_CALL_ACCEPTED,
                lambda s: {},
                {
                    **_follow_up(items),
                    "accepted_at": now,
                    "verification_status": VerificationStatus.PENDING.value,
                },
            )
        accepted = await self._leave_dispatching(
            session,
            items,
            S.ACCEPTED,
            EventType.TOOL_CALL_ACCEPTED,
            lambda s: {},
            {"accepted_at": now},
        )
        return await self._finish(session, cls, items, accepted)

    async def _finish(
        self, session: AsyncSession, cls: _Class, items: list[Sent], accepted: list[Moved]
    ) -> tuple[S, list[Moved]]:
        """The second step of a final answer: ``accepted`` -> completed or confirmed."""
        now = func.now()
        by_key = {s.claim.key: s for s in items}
        if cls is _Class.COMPLETED:
            final, event = S.COMPLETED, EventType.TOOL_CALL_COMPLETED
            fields: dict[str, Any] = {
                "completed_at": now,
                "verification_status": VerificationStatus.CONFIRMED_SUCCESS.value,
            }
            values: Callable[[Sent], dict[str, Any]] = _completion
        else:
            final, event = S.CONFIRMED, EventType.TOOL_CALL_CONFIRMED
            fields = {
                "completed_at": now,
                "reconciliation_status": ReconciliationStatus.SETTLED.value,
                "next_reconcile_at": None,
            }
            values = _settlement
        # Same transaction, rows already locked by the first step: the version that step
        # gave each row fences the second (the lease is released by then).
        done = await move_many(
            session,
            [
                BulkMove(
                    m.row.tool_call_id,
                    m.row.version,
                    values(by_key[(m.row.tenant, m.row.tool_call_id)]),
                    _evidence(by_key[(m.row.tenant, m.row.tool_call_id)].outcome),
                    tenant=m.row.tenant,
                )
                for m in accepted
            ],
            expected=S.ACCEPTED,
            target=final,
            event_type=event,
            producer=self.producer,
            topics=self.topics,
            lease_owner=None,
            fields=fields,
        )
        if len(done) != len(accepted):
            raise RuntimeError("a call locked by this transaction moved under it")
        return final, done

    async def _leave_dispatching(
        self,
        session: AsyncSession,
        items: Sequence[Sent],
        target: S,
        event: EventType,
        values: Callable[[Sent], Mapping[str, Any]],
        fields: Mapping[str, Any],
    ) -> list[Moved]:
        """``dispatching -> target``, each call fenced by this owner's lease and its
        claim's version; the lease is released."""
        return await move_many(
            session,
            [
                BulkMove(
                    s.claim.tool_call_id,
                    s.claim.version,
                    {
                        # Kept when the answer names none.
                        "external_request_id": s.outcome.external_request_id
                        or s.claim.external_request_id,
                        **values(s),
                    },
                    # The claim this outcome ends, as its dispatching event named it.
                    {**_evidence(s.outcome), "worker": self.owner, "claimVersion": s.claim.version},
                    tenant=s.claim.tenant,
                )
                for s in items
            ],
            expected=S.DISPATCHING,
            target=target,
            event_type=event,
            producer=self.producer,
            topics=self.topics,
            lease_owner=self.owner,
            fields={**_RELEASED, **fields},
        )


def _completion(sent: Sent) -> dict[str, Any]:
    return {"result": sent.outcome.result}


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
