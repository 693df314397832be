"""Claiming the calls that are due for a look at the provider.

A claim is one committed statement: the due candidates are locked with ``FOR UPDATE
SKIP LOCKED`` (concurrent reconcilers each get other calls, none waits), and each is
stamped with this reconciler's lease
(:func:`dispatcher.ledger.leases.follow_ups_claim`): its owner, a bumped ``version``
and a ``next_reconcile_at`` pushed to the lease's end, so no other reconciler sees it
as due while the lookups run outside any transaction. Every settlement is fenced by
that owner and version, so a reconciler that stalls past its lease (and whose calls
were claimed again) records nothing. A reconciler that dies simply lets its calls
fall due again when the lease ends.

Candidates are chosen by ``next_reconcile_at``, not by tailing an id: a row whose
commit lands late is still due on the next claim, so no commit-order gap can skip it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

from sqlalchemy import ColumnElement, extract, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.dml import ReturningUpdate

from dispatcher.db.tables import tool_calls
from dispatcher.ledger.leases import follow_ups_claim
from dispatcher.logs import log_context
from dispatcher.states import ExecutionStatus as S
from dispatcher.states import ReconciliationStatus
from dispatcher.tenancy import stored_provider_key

FOLLOWED_UP = (S.RESULT_UNKNOWN, S.ACCEPTED)
"""Statuses the reconciler settles: unknown outcomes, and accepted-but-pending calls."""


@dataclass(frozen=True, slots=True)
class DueCall:
    """A claimed call, with what the policy needs to decide about it."""

    tool_call_id: str
    tenant: str
    run_id: str
    capability_id: str
    status: S
    provider_key: str
    """The key the provider received (``tool_calls.provider_key``): lookups by key
    and compensations use it."""
    external_request_id: str | None
    version: int
    reconcile_attempts: int
    dispatch_attempts: int
    age_seconds: float
    compensation_requested: bool
    last_error: str | None
    traceparent: str | None = None
    """The call's stored trace context: the reconciler's spans join the call's trace."""

    @property
    def redispatches(self) -> int:
        """Re-sends so far: every dispatch after the first."""
        return max(0, self.dispatch_attempts - 1)


_T = TypeVar("_T")


async def about(call: DueCall, work: Awaitable[_T]) -> _T:
    """``work`` (a coroutine not started yet) with the call's ids on every log line it
    writes: each call's lookup, compensation and re-send is a task of its own (the
    reconciler gathers them), so the context is that call's alone."""
    with log_context(
        tool_call_id=call.tool_call_id, run_id=call.run_id, capability_id=call.capability_id
    ):
        return await work


def _age() -> ColumnElement[Any]:
    # From the first dispatch: the provider's idempotency window starts when it first
    # saw the key, and a re-send keeps dispatched_at (see Executor.claim_in).
    started = func.coalesce(tool_calls.c.dispatched_at, tool_calls.c.created_at)
    return extract("epoch", func.now() - started)


def due_condition(due_by: datetime | None = None) -> ColumnElement[bool]:
    """Calls waiting for a lookup whose time has come (by ``due_by``, default now)."""
    return (
        (tool_calls.c.reconciliation_status == ReconciliationStatus.PENDING.value)
        & tool_calls.c.status.in_([s.value for s in FOLLOWED_UP])
        & (tool_calls.c.next_reconcile_at <= (due_by if due_by is not None else func.now()))
    )


_CLAIMED = (
    tool_calls.c.tool_call_id,
    tool_calls.c.tenant,
    tool_calls.c.run_id,
    tool_calls.c.capability_id,
    tool_calls.c.status,
    tool_calls.c.idempotency_key,
    tool_calls.c.provider_key,
    tool_calls.c.external_request_id,
    tool_calls.c.version,
    tool_calls.c.reconcile_attempts,
    tool_calls.c.dispatch_attempts,
    _age().label("age_seconds"),
    tool_calls.c.compensation_requested_at.is_not(None).label("compensation_requested"),
    tool_calls.c.last_error,
    tool_calls.c.traceparent,
)
"""What a claim returns of each call: what :class:`DueCall` holds, in its order."""


def claim_due_query(
    *, owner: str, limit: int, lease_seconds: float, due_by: datetime | None = None
) -> ReturningUpdate[Any]:
    """The statement of :func:`claim_due`: the due calls by the due index, oldest first,
    each claimed by its primary key."""
    candidates = (
        select(tool_calls.c.tenant, tool_calls.c.tool_call_id)
        .where(due_condition(due_by))
        .order_by(tool_calls.c.next_reconcile_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("candidates")
    )
    return follow_ups_claim(
        candidates, owner=owner, lease_seconds=lease_seconds, returning=_CLAIMED
    )


async def claim_due(
    session: AsyncSession,
    *,
    owner: str,
    limit: int,
    lease_seconds: float,
    due_by: datetime | None = None,
) -> list[DueCall]:
    """Claim up to ``limit`` due calls for ``owner``, in the caller's transaction
    (commit it before looking anything up)."""
    claim = claim_due_query(owner=owner, limit=limit, lease_seconds=lease_seconds, due_by=due_by)
    rows = (await session.execute(claim)).all()
    # Unpacked by position and the status looked up in a dict: a batch's rows are
    # decoded here one by one (attribute access and Enum() were 4% of a pass).
    return [
        DueCall(
            tool_call_id=call,
            tenant=tenant,
            run_id=run_id,
            capability_id=capability_id,
            status=_STATUSES[status],
            provider_key=stored_provider_key(tenant, key, provider_key),
            external_request_id=external_id,
            version=version,
            reconcile_attempts=looks,
            dispatch_attempts=sends,
            age_seconds=float(age),
            compensation_requested=bool(compensating),
            last_error=error,
            traceparent=traceparent,
        )
        for (
            call, tenant, run_id, capability_id, status, key, provider_key, external_id,
            version, looks, sends, age, compensating, error, traceparent,
        ) in cast("Sequence[tuple[Any, ...]]", rows)
    ]  # fmt: skip


_STATUSES = {s.value: s for s in FOLLOWED_UP}


async def database_now(session: AsyncSession) -> datetime:
    """The database's clock: what "due" is measured against."""
    now: datetime = (await session.execute(select(func.now()))).scalar_one()
    return now
