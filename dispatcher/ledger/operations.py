"""The only writer of bulk operations (``bulk_operations``) and of the calls they touched
(``bulk_operation_calls``).

An operation's state moves by :data:`dispatcher.states.OPERATION_TRANSITIONS`, each
move a conditional UPDATE (``WHERE state IN (sources)``, and for a processor's writes
its lease owner); zero rows means someone else moved it first and the caller is told
so by ``None``. A processor holds an operation by a lease (the database's clock decides
when it lapsed) and, for the length of each batch, by the row's lock: a cancel waits
for the batch in flight, and no other processor can take the operation over while a
batch of it is being written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import Row, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import bulk_operation_calls, bulk_operations
from dispatcher.ledger.leases import LEASE_RELEASED, take_lease
from dispatcher.states import OperationState, operation_sources

_OPS = bulk_operations.c


async def insert_operation(session: AsyncSession, values: Mapping[str, Any]) -> Row[Any] | None:
    """Record a submitted operation (``running``); None when its tenant already
    submitted one under the same idempotency key (the caller reads that one)."""
    stmt = (
        pg_insert(bulk_operations)
        .values(**values)
        .on_conflict_do_nothing(constraint="uq_bulk_operations_tenant_key")
        .returning(*bulk_operations.c)
    )
    return (await session.execute(stmt)).first()


async def claim_operation(
    session: AsyncSession, *, owner: str, lease_seconds: float, operation_id: str | None = None
) -> Row[Any] | None:
    """Give one running operation nobody holds (never held, or its holder's lease
    lapsed: a killed processor) to ``owner``, oldest lease first.

    ``SKIP LOCKED``: an operation whose batch is being written right now is locked by
    its processor and is not a candidate, whatever its lease says. With
    ``operation_id``, that operation only (the CLI working one in the foreground)."""
    candidates = select(_OPS.operation_id).where(
        _OPS.state == OperationState.RUNNING.value,
        or_(_OPS.lease_expires_at.is_(None), _OPS.lease_expires_at < func.now()),
    )
    if operation_id is not None:
        candidates = candidates.where(_OPS.operation_id == operation_id)
    free = (
        candidates.order_by(_OPS.lease_expires_at.asc().nulls_first())
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    stmt = (
        update(bulk_operations)
        .where(_OPS.operation_id == free, _OPS.state == OperationState.RUNNING.value)
        .values(**take_lease(owner, func.now() + timedelta(seconds=lease_seconds)))
        .returning(*bulk_operations.c)
    )
    return (await session.execute(stmt)).first()


async def release_operation(session: AsyncSession, operation_id: str, owner: str) -> bool:
    """Give up ``owner``'s lease of a running operation (a processor stopping between
    batches): another processor claims it at once instead of after the lease."""
    stmt = (
        update(bulk_operations)
        .where(
            _OPS.operation_id == operation_id,
            _OPS.lease_owner == owner,
            _OPS.state == OperationState.RUNNING.value,
        )
        .values(**LEASE_RELEASED)
    )
    result = await session.execute(stmt)
    return bool(getattr(result, "rowcount", 0))


async def hold_operation(session: AsyncSession, operation_id: str, owner: str) -> Row[Any] | None:
    """The operation, locked until the caller's transaction ends, if it is still running
    and ``owner``'s; None if it was cancelled, finished or taken over."""
    stmt = (
        select(bulk_operations)
        .where(
            _OPS.operation_id == operation_id,
            _OPS.state == OperationState.RUNNING.value,
            _OPS.lease_owner == owner,
        )
        .with_for_update()
    )
    return (await session.execute(stmt)).first()


async def advance(
    session: AsyncSession,
    operation_id: str,
    *,
    owner: str,
    cursor: Mapping[str, Any],
    done: int,
    failed: int,
    lease_seconds: float,
) -> bool:
    """Move the cursor past a batch and count its calls, renewing the lease, in the
    transaction that touched them; False if the operation is no longer ``owner``'s."""
    stmt = (
        update(bulk_operations)
        .where(
            _OPS.operation_id == operation_id,
            _OPS.state == OperationState.RUNNING.value,
            _OPS.lease_owner == owner,
        )
        .values(
            cursor=dict(cursor),
            done=_OPS.done + done,
            failed=_OPS.failed + failed,
            # Renewed: a batch is the proof its processor is alive.
            **take_lease(owner, func.now() + timedelta(seconds=lease_seconds)),
            updated_at=func.now(),
        )
        .returning(_OPS.operation_id)
    )
    return (await session.execute(stmt)).first() is not None


async def move_operation(
    session: AsyncSession,
    operation_id: str,
    target: OperationState,
    *,
    owner: str | None = None,
    tenant: str | None = None,
    values: Mapping[str, Any] | None = None,
) -> Row[Any] | None:
    """Move the operation to ``target`` by the transition table (releasing its lease):
    only ``owner``'s (a processor finishing it) unless None, only ``tenant``'s unless
    None (an admin's cancel). None when it was not in a source state (or not theirs)."""
    stmt = (
        update(bulk_operations)
        .where(
            _OPS.operation_id == operation_id,
            _OPS.state.in_(operation_sources(target)),
        )
        .values(
            state=target.value,
            updated_at=func.now(),
            finished_at=func.now(),
            **LEASE_RELEASED,
            **dict(values or {}),
        )
        .returning(*bulk_operations.c)
    )
    if owner is not None:
        stmt = stmt.where(_OPS.lease_owner == owner)
    if tenant is not None:
        stmt = stmt.where(_OPS.tenant == tenant)
    return (await session.execute(stmt)).first()


async def record_touched(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Record each call a batch touched (``operation_id``, ``tenant``, ``tool_call_id``,
    ``outcome``, ``code``, ``detail``, ``event_id``). No ``ON CONFLICT``: a call this
    operation already touched is a bug upstream, and its batch must fail rather than
    touch the call a second time."""
    if rows:
        await session.execute(pg_insert(bulk_operation_calls), [dict(r) for r in rows])
