"""Submitting an operation (or a dry run of it), reading it, its touched calls, and
cancelling it: what the API, the CLI and the console call, in the caller's transaction.

Who may name which calls is decided here once: a filter reaches the caller's own
tenant's calls, another tenant's or every tenant's only with the ``admin`` scope
(checked by the caller, told here by ``admin``). An operation is read and cancelled by
its submitter's tenant, or by an admin.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from sqlalchemy import func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.control.actor import Actor
from dispatcher.db.tables import bulk_operation_calls, bulk_operations
from dispatcher.errors import (
    Forbidden,
    IdempotencyKeyReused,
    OperationFinished,
    OperationNotFound,
    ValidationFailed,
)
from dispatcher.ids import random_hex
from dispatcher.ledger.operations import insert_operation, move_operation
from dispatcher.operations.actions import ACTIONS
from dispatcher.operations.models import (
    DryRunView,
    OperationRequest,
    OperationView,
    TouchedCall,
    TouchedCalls,
)
from dispatcher.operations.processor import notify_finished
from dispatcher.operations.sources import source_of
from dispatcher.schemas import ID_MAX_LENGTH, check_identifier
from dispatcher.states import OperationState

SAMPLE = 10
"""Calls a dry run shows."""


def stored(request: OperationRequest, *, tenant: str, admin: bool) -> dict[str, Any]:
    """The filter as the operation keeps it: its tenant resolved (None: every tenant's)
    and its statuses listed. Raises :class:`Forbidden` for another tenant's calls, or
    every tenant's, without ``admin``."""
    wanted = request.filter
    scope = None if wanted.every_tenant else (wanted.tenant or tenant)
    if scope != tenant and not admin:
        raise Forbidden(
            "another tenant's calls, or every tenant's, need the 'admin' scope", scope="admin"
        )
    kept = wanted.model_dump(mode="json", by_alias=True, exclude={"every_tenant", "tenant"})
    return kept | {"tenant": scope, "status": [s.value for s in request.statuses()]}


def _checked(request: OperationRequest, *, tenant: str, admin: bool) -> dict[str, Any]:
    if request.kind not in ACTIONS:
        raise ValidationFailed(f"{request.kind.value} operations are not available", field="kind")
    return stored(request, tenant=tenant, admin=admin)


async def dry_run(
    session: AsyncSession, request: OperationRequest, *, tenant: str, admin: bool
) -> DryRunView:
    """How many calls the operation would touch now, and the first of them."""
    where = _checked(request, tenant=tenant, admin=admin)
    source = source_of(request.kind)
    found = await source.count(session, where)
    sample = await source.sample(session, where, SAMPLE)
    return DryRunView(kind=request.kind, filter=where, count=found, sample=sample)


async def submit(
    session: AsyncSession,
    request: OperationRequest,
    *,
    tenant: str,
    admin: bool,
    actor: Actor,
) -> tuple[OperationView, bool]:
    """The recorded operation (``running``, its total counted as of its submission),
    and whether it was recorded just now (False: its key was submitted before, with the
    same request). Raises :class:`IdempotencyKeyReused` when the key made an operation
    of another request."""
    where = _checked(request, tenant=tenant, admin=admin)
    params = {"reason": request.reason, "newIdempotencyKey": request.new_idempotency_key}
    if request.finding is not None:
        params["finding"] = request.finding.value
    row = await insert_operation(
        session,
        {
            "operation_id": f"op_{random_hex()}",
            "tenant": tenant,
            "kind": request.kind.value,
            "filter": where,
            "params": params,
            "actor": actor.as_payload(),
            "idempotency_key": request.idempotency_key,
            # Counted in the statement's transaction: its now() is the row's created_at,
            # the bound the processor selects by.
            "total": await source_of(request.kind).count(session, where),
        },
    )
    if row is None:
        earlier = select(bulk_operations).where(
            bulk_operations.c.tenant == tenant,
            bulk_operations.c.idempotency_key == request.idempotency_key,
        )
        made = (await session.execute(earlier)).one()
        # The same request again is a replay, whoever sends it; another under its key
        # is refused, as a tool call's is (its filter compared as it was kept).
        if (made.kind, made.filter, made.params) != (request.kind.value, where, params):
            raise IdempotencyKeyReused(
                request.idempotency_key or "", operation_id=made.operation_id
            )
        return OperationView.of(made._mapping), False
    return OperationView.of(row._mapping), True


def _visible(operation_id: str, tenant: str | None) -> list[Any]:
    where = [bulk_operations.c.operation_id == operation_id]
    if tenant is not None:
        where.append(bulk_operations.c.tenant == tenant)
    return where


async def show(session: AsyncSession, operation_id: str, *, tenant: str | None) -> OperationView:
    """The operation, if ``tenant``'s (None: an admin, any tenant's)."""
    row = (
        await session.execute(select(bulk_operations).where(*_visible(operation_id, tenant)))
    ).first()
    if row is None:
        raise OperationNotFound(operation_id)
    return OperationView.of(row._mapping)


async def cancel(
    session: AsyncSession, operation_id: str, *, tenant: str | None, actor: Actor
) -> OperationView:
    """Stop a running operation: the batch in flight finishes first (it holds the row),
    nothing after it is touched; its ``operation.finished`` webhook says so. Raises
    :class:`OperationFinished` once it completed or was cancelled."""
    moved = await move_operation(
        session,
        operation_id,
        OperationState.CANCELLED,
        tenant=tenant,
        values={"cancelled_by": actor.as_payload()},
    )
    if moved is not None:
        await notify_finished(session, dict(moved._mapping))
        return OperationView.of(moved._mapping)
    current = await show(session, operation_id, tenant=tenant)
    raise OperationFinished(operation_id, current.state.value)


def _token(tenant: str, tool_call_id: str) -> str:
    raw = json.dumps([tenant, tool_call_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _after(token: str) -> tuple[str, str]:
    try:
        tenant, tool_call_id = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return check_identifier(tenant, ID_MAX_LENGTH), check_identifier(tool_call_id)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise ValidationFailed(
            "after must be the `next` of a page of this list", field="after"
        ) from exc


async def touched(
    session: AsyncSession,
    operation_id: str,
    *,
    tenant: str | None,
    limit: int,
    after: str | None = None,
) -> TouchedCalls:
    """A page of the calls the operation touched, by tenant and id (the results' key)."""
    await show(session, operation_id, tenant=tenant)
    c = bulk_operation_calls.c
    query = select(bulk_operation_calls).where(c.operation_id == operation_id)
    if after is not None:
        query = query.where(tuple_(c.tenant, c.tool_call_id) > tuple_(*_after(after)))
    rows = (await session.execute(query.order_by(c.tenant, c.tool_call_id).limit(limit + 1))).all()
    calls = [TouchedCall.model_validate(r._mapping) for r in rows[:limit]]
    following = _token(calls[-1].tenant, calls[-1].tool_call_id) if len(rows) > limit else None
    return TouchedCalls(calls=calls, next=following)


async def counted_outcomes(session: AsyncSession, operation_id: str) -> dict[str, int]:
    """How many touched calls each outcome has (what ``done`` and ``failed`` count)."""
    c = bulk_operation_calls.c
    rows = await session.execute(
        select(c.outcome, func.count()).where(c.operation_id == operation_id).group_by(c.outcome)
    )
    return {outcome: int(n) for outcome, n in rows}
