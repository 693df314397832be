"""The only code that changes a tool call's execution status.

Every move is checked against :data:`dispatcher.states.TRANSITIONS`, applied with a
conditional UPDATE (``WHERE status IN (:expected)`` plus optional lease/version
fences), and recorded as an execution event in the same transaction. Zero rows
updated means someone else moved the call first: :class:`TransitionConflict`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Integer, Row, Text, cast, column, func, update, values
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.errors import TransitionConflict
from dispatcher.events import DEFAULT_EVENTS_TOPIC, CallContext, EventType, event_row, record_events
from dispatcher.states import ExecutionStatus, check_transition
from dispatcher.tables import tool_calls


async def move(
    session: AsyncSession,
    tool_call_id: str,
    *,
    expected: ExecutionStatus | Iterable[ExecutionStatus],
    target: ExecutionStatus,
    event_type: EventType,
    producer: str,
    fields: Mapping[str, Any] | None = None,
    payload: Mapping[str, Any] | None = None,
    causation_id: str | None = None,
    lease_owner: str | None = None,
    version: int | None = None,
    events_topic: str | None = DEFAULT_EVENTS_TOPIC,
) -> Row[Any]:
    """Move one call from one of ``expected`` to ``target`` and record ``event_type``.

    ``lease_owner`` / ``version`` fence out a worker whose claim was taken over: its
    UPDATE matches nothing and it learns so through :class:`TransitionConflict`.
    Returns the updated row.
    """
    sources = [expected] if isinstance(expected, ExecutionStatus) else list(expected)
    for source in sources:
        check_transition(source, target)

    stmt = (
        update(tool_calls)
        .where(
            tool_calls.c.tool_call_id == tool_call_id,
            tool_calls.c.status.in_([s.value for s in sources]),
        )
        .values(
            status=target.value,
            version=tool_calls.c.version + 1,
            updated_at=func.now(),
            **dict(fields or {}),
        )
        .returning(*tool_calls.c)
    )
    if lease_owner is not None:
        stmt = stmt.where(tool_calls.c.lease_owner == lease_owner)
    if version is not None:
        stmt = stmt.where(tool_calls.c.version == version)

    row = (await session.execute(stmt)).first()
    if row is None:
        raise TransitionConflict(
            f"tool call {tool_call_id!r} is no longer in {[s.value for s in sources]}"
            " (or its lease/version changed)",
            toolCallId=tool_call_id,
            target=target.value,
        )
    event = event_row(
        event_type,
        CallContext.of(row._mapping),
        producer=producer,
        causation_id=causation_id,
        payload={"from": [s.value for s in sources], "to": target.value, **dict(payload or {})},
    )
    await record_events(session, [event], topic=events_topic)
    return row


@dataclass(frozen=True, slots=True)
class BulkMove:
    """One call of a :func:`move_many`: the version its claim saw, its own column
    values, and its event's payload."""

    tool_call_id: str
    version: int
    values: Mapping[str, Any] = field(default_factory=dict)
    payload: Mapping[str, Any] = field(default_factory=dict)


async def move_many(
    session: AsyncSession,
    moves: Sequence[BulkMove],
    *,
    expected: ExecutionStatus | Iterable[ExecutionStatus],
    target: ExecutionStatus,
    event_type: EventType,
    producer: str,
    lease_owner: str,
    fields: Mapping[str, Any] | None = None,
    events_topic: str | None = DEFAULT_EVENTS_TOPIC,
) -> list[Row[Any]]:
    """:func:`move` for many calls in three statements: one conditional UPDATE (each
    row fenced by status, ``lease_owner`` and its own version), one INSERT of events,
    one of outbox rows.

    Every move must carry the same ``values`` keys. A call that no longer matches its
    fence is skipped rather than failing the batch: its row is simply missing from
    the result, and the caller treats it as taken over.
    """
    if not moves:
        return []
    sources = [expected] if isinstance(expected, ExecutionStatus) else list(expected)
    for source in sources:
        check_transition(source, target)
    names = sorted(moves[0].values)
    rows = values(
        column("tool_call_id", Text),
        column("fence_version", Integer),
        *(column(name, tool_calls.c[name].type) for name in names),
        name="v",
    ).data([(m.tool_call_id, m.version, *(m.values[name] for name in names)) for m in moves])
    stmt = (
        update(tool_calls)
        .where(
            tool_calls.c.tool_call_id == rows.c.tool_call_id,
            tool_calls.c.version == rows.c.fence_version,
            tool_calls.c.status.in_([s.value for s in sources]),
            tool_calls.c.lease_owner == lease_owner,
        )
        .values(
            status=target.value,
            version=tool_calls.c.version + 1,
            updated_at=func.now(),
            **dict(fields or {}),
            # VALUES columns arrive untyped: cast each to its column's type.
            **{name: cast(rows.c[name], tool_calls.c[name].type) for name in names},
        )
        .returning(*tool_calls.c)
    )
    moved = list((await session.execute(stmt)).all())
    by_id = {m.tool_call_id: m for m in moves}
    came_from = [s.value for s in sources]
    events = [
        event_row(
            event_type,
            CallContext.of(row._mapping),
            producer=producer,
            payload={
                "from": came_from,
                "to": target.value,
                **dict(by_id[row.tool_call_id].payload),
            },
        )
        for row in moved
    ]
    await record_events(session, events, topic=events_topic)
    return moved
