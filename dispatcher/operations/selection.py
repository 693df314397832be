"""Which calls an operation selects, and in which order it works through them.

A filter becomes one WHERE clause over ``tool_calls``; the calls are read in the order
(tenant, status, updated_at, tool_call_id), a batch at a time after the keyset cursor
the operation's row keeps. For failed and escalated calls that order is the order of
``ix_tool_calls_operable``, so a batch is a range of that index and costs its own rows
however deep into the operation it is; queued calls (a cancel) are the live set.

Every operation reads the calls as they stood when it was submitted: ``updated_at``
no later than its ``created_at``. A call that changes afterwards (retried by the
operation and failed again, say) is past that bound and not selected twice, and the
dry run's count is what the operation would touch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, exists, func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import bulk_operation_calls, tool_calls
from dispatcher.operations.models import CallSample

T = tool_calls.c
ORDER = (T.tenant, T.status, T.updated_at, T.tool_call_id)
"""The order an operation works in, that of ``ix_tool_calls_operable``."""


def where_of(stored: Mapping[str, Any], as_of: ColumnElement[Any] | datetime) -> list[Any]:
    """The conditions of a stored filter (:func:`dispatcher.operations.service.stored`):
    its ``tenant`` is resolved (None: every tenant) and its ``status`` a list."""
    where: list[Any] = [T.status.in_(stored["status"]), T.updated_at <= as_of]
    if stored.get("tenant") is not None:
        where.append(T.tenant == stored["tenant"])
    if stored.get("capabilityId") is not None:
        where.append(T.capability_id == stored["capabilityId"])
    if stored.get("runId") is not None:
        where.append(T.run_id == stored["runId"])
    if stored.get("lastError") is not None:
        # A prefix, its % and _ taken literally.
        where.append(T.last_error.startswith(stored["lastError"], autoescape=True))
    if stored.get("since") is not None:
        where.append(T.updated_at >= datetime.fromisoformat(stored["since"]))
    if stored.get("until") is not None:
        where.append(T.updated_at < datetime.fromisoformat(stored["until"]))
    return where


async def count(session: AsyncSession, stored: Mapping[str, Any]) -> int:
    """How many calls the filter selects now (the transaction's ``now()``)."""
    query = select(func.count()).select_from(tool_calls).where(*where_of(stored, func.now()))
    return int((await session.execute(query)).scalar_one())


async def sample(session: AsyncSession, stored: Mapping[str, Any], limit: int) -> list[CallSample]:
    """The first ``limit`` calls the filter selects now, in the operation's order."""
    query = (
        select(T.tenant, T.tool_call_id, T.run_id, T.capability_id, T.status, T.last_error)
        .add_columns(T.updated_at)
        .where(*where_of(stored, func.now()))
        .order_by(*ORDER)
        .limit(limit)
    )
    return [CallSample.model_validate(r._mapping) for r in await session.execute(query)]


def batch_query(
    operation_id: str,
    stored: Mapping[str, Any],
    as_of: datetime,
    cursor: Mapping[str, Any] | None,
    limit: int,
) -> Select[Any]:
    """The next ``limit`` calls after ``cursor`` that this operation has not touched
    (the calls' sort keys). The NOT EXISTS is a primary-key probe per call: a batch
    whose work was rolled back is selected again, one that committed never is, even
    should a cursor lag behind what was recorded."""
    touched = exists().where(
        bulk_operation_calls.c.operation_id == operation_id,
        bulk_operation_calls.c.tenant == T.tenant,
        bulk_operation_calls.c.tool_call_id == T.tool_call_id,
    )
    query = select(*ORDER).where(*where_of(stored, as_of), ~touched)
    if cursor is not None:
        after = (
            cursor["tenant"],
            cursor["status"],
            datetime.fromisoformat(cursor["updatedAt"]),
            cursor["toolCallId"],
        )
        query = query.where(tuple_(*ORDER) > tuple_(*after))
    return query.order_by(*ORDER).limit(limit)


async def next_batch(
    session: AsyncSession,
    operation_id: str,
    stored: Mapping[str, Any],
    as_of: datetime,
    cursor: Mapping[str, Any] | None,
    limit: int,
) -> Sequence[Any]:
    """:func:`batch_query`'s rows (``tenant``, ``status``, ``updated_at``,
    ``tool_call_id``)."""
    found = await session.execute(batch_query(operation_id, stored, as_of, cursor, limit))
    return list(found.all())


def cursor_of(row: Any) -> dict[str, Any]:
    """The cursor after ``row`` of a batch, as the operation's row stores it."""
    return {
        "tenant": row.tenant,
        "status": row.status,
        "updatedAt": row.updated_at.isoformat(),
        "toolCallId": row.tool_call_id,
    }
