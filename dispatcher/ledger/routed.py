"""Moves of many calls out of one status, each to its own target, in one statement.

:func:`move_many` sends a whole batch to one target. A worker's outcomes go to several
(completed, accepted, failed, result_unknown), and one statement per target made a
batch's bookkeeping a handful of round trips. Here the target travels with each call
in the per-call JSON (:func:`dispatcher.ledger.transitions.per_call_values`), every
column a target writes is a ``CASE`` on the call's target, and a column its target does
not write keeps its value. Each call's event (and its outbox row) is built beforehand
for its own target and travels in the same statement, which inserts the events of the
rows the UPDATE moved: the batch is one round trip, whatever the mix of targets. A
diverted call's event is its target's, retyped in the statement (:func:`_retyped`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    case,
    column,
    func,
    insert,
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.dml import ReturningUpdate
from sqlalchemy.sql.selectable import CTE, TableValuedAlias

from dispatcher.db.tables import execution_events, outbox, tool_calls
from dispatcher.ledger import summaries
from dispatcher.ledger.batched import EVENT_COLUMNS, MESSAGE_COLUMNS
from dispatcher.ledger.events import (
    CallContext,
    EventType,
    envelope_sql,
    event_row,
    published_sql,
)
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.transitions import (
    BulkMove,
    Moved,
    count_moves,
    fenced_by,
    keys_of,
    log_moves,
    per_call_values,
)
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import ExecutionStatus, check_transition
from dispatcher.tenancy import ordering_key_sql


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
    """A :class:`BulkMove`, its target, and the context of its event (known before the
    move: a worker's claim returned it)."""

    move: BulkMove
    target: ExecutionStatus
    context: CallContext


RETURNED = [
    tool_calls.c[name]
    for name in ("tenant", "tool_call_id", "run_id", "status", "version", "traceparent")
]
"""What :func:`move_each` reads back of a moved call: its key, its run (whose summary
counts the move), the status the UPDATE chose, the version it left and its stored trace
(for its transition line); its caller has the rest."""


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
    unless None, at its move's version unless None) to its own target, and record its
    event and outbox row, and count it in its run's summary
    (:mod:`dispatcher.ledger.summaries`), in ONE statement.

    ``fields`` are set whatever the target. As with :func:`move_many`, a call whose
    fence no longer holds is skipped (missing from the result, and no event of it
    written); each moved call comes back (its key, status and version) with its event.
    """
    if not moves:
        return []
    _check(moves, expected, routes, divert)
    # Sorted, so concurrent batches lock shared rows in one order and cannot deadlock.
    ordered = sorted(moves, key=lambda r: r.move.key)
    moved = _update(ordered, expected, routes, lease_owner, fields or {}, divert).cte("moved")
    # Each call's event, written before the move is known: the statement keeps those of
    # the calls it moved, retyped where it diverted one, and none of a call it skipped.
    candidates = [_candidate(routed, expected, routes, producer) for routed in ordered]
    statement = _recorded(moved, candidates, topics, _retyped(routes, divert))
    tally = summaries.pending(session)
    if tally is None:
        statement = statement.add_cte(summaries.counted(moved, [expected], routes))
    rows = (await session.execute(statement)).all()
    if tally is not None:
        for r in rows:
            tally.move(r.tenant, r.run_id, expected.value, r.status)
    capability = {r.move.key: r.context.capability_id for r in ordered}
    count_moves([expected], [(r.status, capability[(r.tenant, r.tool_call_id)]) for r in rows])
    chosen = {(e["tenant"], e["tool_call_id"]): e for e in candidates}
    result = [
        Moved(row, _as_moved(chosen[(row.tenant, row.tool_call_id)], row.status, routes))
        for row in rows
    ]
    log_moves([expected], result)
    return result


def _update(
    ordered: Sequence[RoutedMove],
    expected: ExecutionStatus,
    routes: Mapping[ExecutionStatus, Route],
    lease_owner: str | None,
    fields: Mapping[str, Any],
    divert: Divert | None,
) -> ReturningUpdate[Any]:
    """The fenced UPDATE of the calls, returning each moved call's key, status and
    version."""
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
        **dict(fields),
        **_written(routes, v.c, status),
    )
    if lease_owner is not None:
        stmt = stmt.where(tool_calls.c.lease_owner == lease_owner)
    return stmt.returning(*RETURNED)


def _candidate(
    routed: RoutedMove,
    expected: ExecutionStatus,
    routes: Mapping[ExecutionStatus, Route],
    producer: Producer,
) -> dict[str, Any]:
    """The event of the call's own target."""
    return event_row(
        routes[routed.target].event_type,
        routed.context,
        producer=producer,
        payload={"from": [expected.value], "to": routed.target.value, **routed.move.payload},
    )


def _as_moved(
    event: Mapping[str, Any], status: str, routes: Mapping[ExecutionStatus, Route]
) -> Mapping[str, Any]:
    """``event`` as the statement recorded it for a call moved to ``status``: retyped
    when a divert moved the call elsewhere than its target (:func:`_retyped`)."""
    if event["payload"]["to"] == status:
        return event
    route = routes[ExecutionStatus(status)]
    return {
        **event,
        "event_type": route.event_type.value,
        "payload": {**event["payload"], "to": status},
    }


def _retyped(
    routes: Mapping[ExecutionStatus, Route], divert: Divert | None
) -> tuple[str, str] | None:
    """The divert's target status and its event type, as SQL constants: a diverted
    call's event is its target's with these instead. Its event id and the rest stay:
    the call has one event either way, so sending one candidate per call halves what
    the statement parses and joins (each completed call carried its divert's too)."""
    if divert is None:
        return None
    return (divert.target.value, routes[divert.target].event_type.value)


def _recorded(
    moved: CTE,
    candidates: Sequence[Mapping[str, Any]],
    topics: Topics,
    retyped: tuple[str, str] | None,
) -> Select[Any]:
    """The moved calls, with their events and their outbox rows inserted, as one
    statement: PostgreSQL runs every data-modifying CTE to completion whether or not
    the main SELECT reads it. Each message is built from its event in the statement
    (:func:`dispatcher.ledger.events.envelope_sql`); an event of a log-only type
    (:data:`dispatcher.ledger.events.LOG_ONLY`) gets none."""
    events = [
        {**c, "occurred_at": iso, "occurred": iso, "to_status": c["payload"]["to"], "ord": i}
        for i, c in enumerate(candidates)
        for iso in (c["occurred_at"].isoformat(),)
    ]
    e = _recordset("events", events, ("to_status", "occurred"))
    # The events of the moved calls; read twice (the events, then their messages), so
    # PostgreSQL materializes it once.
    chosen = (
        select(*_as_recorded(e, moved, retyped))
        .join_from(
            e,
            moved,
            and_(moved.c.tenant == e.c.tenant, moved.c.tool_call_id == e.c.tool_call_id),
        )
        .cte("chosen")
    )
    inserted = insert(execution_events).from_select(
        EVENT_COLUMNS,
        select(*(chosen.c[name] for name in EVENT_COLUMNS)).order_by(chosen.c.ord),
    )
    payload, headers = envelope_sql("chosen", "chosen.occurred")
    published = insert(outbox).from_select(
        MESSAGE_COLUMNS,
        select(
            bindparam("events_topic", topics.events, type_=Text),
            literal_column(ordering_key_sql("chosen.tenant", "chosen.run_id"), Text),
            literal_column(payload, JSONB),
            literal_column(headers, JSONB),
        )
        .select_from(chosen)
        .where(text(published_sql("chosen")))
        .order_by(chosen.c.ord),
    )
    return select(moved).add_cte(inserted.cte("recorded")).add_cte(published.cte("published"))


def _as_recorded(
    e: TableValuedAlias, moved: CTE, retyped: tuple[str, str] | None
) -> list[ColumnElement[Any]]:
    """The candidates' columns, with a diverted call's event retyped: only a divert
    moves a call elsewhere than its target, and always to the divert's target."""
    if retyped is None:
        return list(e.c)
    status, event_type = retyped
    diverted = moved.c.status != e.c.to_status
    to = literal_column(f"'{json.dumps(status)}'::jsonb", JSONB)
    replaced = {
        "event_type": literal_column(f"'{event_type}'", Text),
        "payload": func.jsonb_set(e.c.payload, literal_column("'{to}'::text[]"), to),
    }
    return [
        case((diverted, replaced[c.name]), else_=c).label(c.name) if c.name in replaced else c
        for c in e.c
    ]


def _recordset(name: str, rows: list[dict[str, Any]], texts: Sequence[str]) -> TableValuedAlias:
    """``rows`` as one JSON parameter, typed as ``execution_events``' columns, plus the
    text columns ``texts`` and their position ``ord``."""
    return (
        func.jsonb_to_recordset(bindparam(name, rows, type_=JSONB))
        .table_valued(
            *(column(c, execution_events.c[c].type) for c in EVENT_COLUMNS),
            *(column(t, Text) for t in texts),
            column("ord", Integer),
        )
        .render_derived(name=name, with_types=True)
    )


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
