"""Moves of many calls out of one status, each to its own target, in one UPDATE.

:func:`move_many` sends a whole batch to one target. A worker's outcomes go to several
(completed, accepted, failed, result_unknown), and one statement per target made a
batch's bookkeeping a handful of round trips. Here the target travels with each call
in the per-call JSON (:func:`dispatcher.ledger.transitions.per_call_values`), every
column a target writes is a ``CASE`` on the call's target, and a column its target does
not write keeps its value. The events follow from the status each row came back with,
so the batch costs one UPDATE and one INSERT (its events and outbox rows) whatever the
mix of targets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Text, and_, case, column, func, literal_column, update
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import tool_calls
from dispatcher.ledger.events import CallContext, EventType, event_row
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.transitions import (
    MOVED_COLUMNS,
    BulkMove,
    Moved,
    fenced_by,
    keys_of,
    per_call_values,
    record_all,
)
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import ExecutionStatus, check_transition


@dataclass(frozen=True, slots=True)
class Route:
    """What a move to one target records: its event, the per-call columns each of its
    moves carries (``values`` of a :class:`RoutedMove`), and the SQL ``fields`` it
    sets besides (``now()``, a delay looked up per capability)."""

    event_type: EventType
    values: tuple[str, ...] = ()
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Divert:
    """Calls routed to ``source`` go to ``target`` instead when ``when`` holds of their
    row as the UPDATE finds it (under the row lock the UPDATE takes). The diverted
    call's ``values`` must include those of ``target``'s route."""

    source: ExecutionStatus
    target: ExecutionStatus
    when: ColumnElement[bool]


@dataclass(frozen=True, slots=True)
class RoutedMove:
    """A :class:`BulkMove` and its target."""

    move: BulkMove
    target: ExecutionStatus


def _check(
    moves: Sequence[RoutedMove],
    expected: ExecutionStatus,
    routes: Mapping[ExecutionStatus, Route],
    divert: Divert | None,
) -> None:
    """Every pair the statement may write, against the transition table, before it is
    sent; and every move carries exactly its route's columns."""
    targets = set(routes)
    for target in targets:
        check_transition(expected, target)
    if divert is not None:
        if divert.source not in targets or divert.target not in targets:
            raise ValueError("a divert needs a route for its source and its target")
        if not set(routes[divert.target].values) <= set(routes[divert.source].values):
            raise ValueError(f"{divert.source} moves lack the values of {divert.target}")
    for target, declared in routes.items():
        if set(declared.values) & set(declared.fields):
            raise ValueError(f"the route to {target} takes a column per call and as a field")
    for routed in moves:
        route = routes.get(routed.target)
        if route is None:
            raise ValueError(f"no route to {routed.target}")
        if set(routed.move.values) != set(route.values):
            raise ValueError(f"a move to {routed.target} carries {sorted(routed.move.values)}")


async def move_each(
    session: AsyncSession,
    moves: Sequence[RoutedMove],
    *,
    expected: ExecutionStatus,
    routes: Mapping[ExecutionStatus, Route],
    producer: Producer,
    lease_owner: str | None,
    fields: Mapping[str, Any] | None = None,
    divert: Divert | None = None,
    topics: Topics = DEFAULT_TOPICS,
) -> list[Moved]:
    """Move each call of ``moves`` that is still ``expected`` (held by ``lease_owner``
    unless None, at its move's version unless None) to its own target, in two
    statements: one UPDATE, one INSERT of the events and their outbox rows.

    ``fields`` are set whatever the target. As with :func:`move_many`, a call whose
    fence no longer holds is skipped (missing from the result); each moved call comes
    back with its event, named by the status it was moved to.
    """
    if not moves:
        return []
    _check(moves, expected, routes, divert)
    # Sorted, so concurrent batches lock shared rows in one order and cannot deadlock.
    ordered = sorted(moves, key=lambda r: r.move.key)
    names = sorted({name for route in routes.values() for name in route.values})
    v = per_call_values(
        [
            BulkMove(
                r.move.tool_call_id,
                r.move.version,
                {**r.move.values, "target": r.target.value},
                tenant=r.move.tenant,
            )
            for r in ordered
        ],
        names,
        column("target", Text),
    )
    status = _status(v.c.target, divert)
    keys = keys_of([r.move for r in ordered])
    stmt = fenced_by(
        update(tool_calls).where(keys, tool_calls.c.status == expected.value), v
    ).values(
        status=status,
        version=tool_calls.c.version + 1,
        updated_at=func.now(),
        **dict(fields or {}),
        **_written(routes, v.c, status),
    )
    if lease_owner is not None:
        stmt = stmt.where(tool_calls.c.lease_owner == lease_owner)
    moved = list((await session.execute(stmt.returning(*MOVED_COLUMNS))).all())
    by_key = {r.move.key: r.move for r in moves}
    events = [
        event_row(
            routes[ExecutionStatus(row.status)].event_type,
            CallContext.of(row._mapping),
            producer=producer,
            payload={
                "from": [expected.value],
                "to": row.status,
                **dict(by_key[(row.tenant, row.tool_call_id)].payload),
            },
        )
        for row in moved
    ]
    await record_all(session, events, topics)
    return [Moved(row, event) for row, event in zip(moved, events, strict=True)]


def _status(target: ColumnElement[Any], divert: Divert | None) -> ColumnElement[Any]:
    """The status each row is moved to: its move's target, unless diverted."""
    if divert is None:
        return target
    return case(
        (and_(target == divert.source.value, divert.when), _text(divert.target)),
        else_=target,
    )


def _written(
    routes: Mapping[ExecutionStatus, Route], v: Any, status: ColumnElement[Any]
) -> dict[str, ColumnElement[Any]]:
    """Each column some route writes: what the row's route writes, or its value kept.
    A per-call value every route takes is simply written."""
    columns = {name for route in routes.values() for name in (*route.values, *route.fields)}
    written: dict[str, ColumnElement[Any]] = {}
    for name in sorted(columns):
        if all(name in route.values and name not in route.fields for route in routes.values()):
            written[name] = v[name]
            continue
        whens = {
            target.value: route.fields[name] if name in route.fields else v[name]
            for target, route in routes.items()
            if name in route.fields or name in route.values
        }
        written[name] = case(whens, value=status, else_=tool_calls.c[name])
    return written


def _text(status: ExecutionStatus) -> ColumnElement[Any]:
    # A constant of the enum, not a parameter: it types the CASE as text.
    return literal_column(f"'{status.value}'", Text)
