"""Which dead letters an operation selects, and in which order: the outbox rows the
relay gave up on, by the tenant their payload names and their id, the order of
``ix_outbox_dead_letters_tenant`` (a batch is a range of it, whatever the published
history around them). As for calls, an operation reads them as they stood when it was
submitted: a row dead-lettered again after it was retried is not selected twice.

A dead letter is recorded as touched under its tenant and its id (as text) in the
place of a call's id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, Text, exists, func, literal_column, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import bulk_operation_calls, outbox
from dispatcher.operations.models import DeadLetterSample

OB = outbox.c
# Spelled as the index spells it, a constant key rather than a bound one, so every plan
# of the statement (a prepared statement's generic one too) can use the index.
TENANT: ColumnElement[str] = OB.payload.op("->>", return_type=Text)(literal_column("'tenant'"))
ORDER = (TENANT, OB.id)
"""The order an operation works through dead letters in, that of their index."""


def where_of(stored: Mapping[str, Any], as_of: ColumnElement[Any] | datetime) -> list[Any]:
    """The conditions of a stored filter: tenant (None: every tenant's), ``lastError``
    (a prefix), ``since`` / ``until`` (when the row was dead-lettered)."""
    where: list[Any] = [OB.dead_lettered_at.is_not(None), OB.dead_lettered_at <= as_of]
    if stored.get("tenant") is not None:
        where.append(TENANT == stored["tenant"])
    else:
        where.append(TENANT.is_not(None))
    if stored.get("lastError") is not None:
        where.append(OB.last_error.startswith(stored["lastError"], autoescape=True))
    if stored.get("since") is not None:
        where.append(OB.dead_lettered_at >= datetime.fromisoformat(stored["since"]))
    if stored.get("until") is not None:
        where.append(OB.dead_lettered_at < datetime.fromisoformat(stored["until"]))
    return where


async def count(session: AsyncSession, stored: Mapping[str, Any]) -> int:
    query = select(func.count()).select_from(outbox).where(*where_of(stored, func.now()))
    return int((await session.execute(query)).scalar_one())


async def sample(
    session: AsyncSession, stored: Mapping[str, Any], limit: int
) -> list[DeadLetterSample]:
    query = (
        select(TENANT.label("tenant"), OB.id, OB.topic, OB.key, OB.last_error, OB.dead_lettered_at)
        .where(*where_of(stored, func.now()))
        .order_by(*ORDER)
        .limit(limit)
    )
    return [DeadLetterSample.model_validate(r._mapping) for r in await session.execute(query)]


def batch_query(
    operation_id: str,
    stored: Mapping[str, Any],
    as_of: datetime,
    cursor: Mapping[str, Any] | None,
    limit: int,
) -> Select[Any]:
    """The next ``limit`` dead letters after ``cursor`` not touched by this operation
    (see :func:`dispatcher.operations.selection.batch_query`)."""
    touched = exists().where(
        bulk_operation_calls.c.operation_id == operation_id,
        bulk_operation_calls.c.tenant == TENANT,
        bulk_operation_calls.c.tool_call_id == func.cast(OB.id, Text),
    )
    query = select(TENANT.label("tenant"), OB.id).where(*where_of(stored, as_of), ~touched)
    if cursor is not None:
        query = query.where(tuple_(*ORDER) > tuple_(cursor["tenant"], int(cursor["id"])))
    return query.order_by(*ORDER).limit(limit)


async def next_batch(
    session: AsyncSession,
    operation_id: str,
    stored: Mapping[str, Any],
    as_of: datetime,
    cursor: Mapping[str, Any] | None,
    limit: int,
) -> Sequence[Any]:
    """:func:`batch_query`'s rows (``tenant``, ``id``), each with its id as text in
    ``tool_call_id``, as the touched rows record it."""
    found = await session.execute(batch_query(operation_id, stored, as_of, cursor, limit))
    return [_Row(r.tenant, r.id) for r in found]


class _Row:
    __slots__ = ("id", "tenant", "tool_call_id")

    def __init__(self, tenant: str, row_id: int) -> None:
        self.tenant, self.id, self.tool_call_id = tenant, row_id, str(row_id)


def cursor_of(row: Any) -> dict[str, Any]:
    return {"tenant": row.tenant, "id": row.id}
