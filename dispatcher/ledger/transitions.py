"""The only code that changes a tool call's execution status (with
:mod:`dispatcher.ledger.routed`, which moves a batch to several targets at once on the
helpers here).

Every move is checked against :data:`dispatcher.states.TRANSITIONS`, applied with a
conditional UPDATE (``WHERE status IN (:expected)`` plus an optional :class:`Fence`),
recorded as an execution event in the same transaction, and counted in its run's
summary by the same statement (:mod:`dispatcher.ledger.summaries`). Zero rows updated
means someone else moved the call first: :class:`TransitionConflict`. A mover gets back the
row and the event (:class:`Moved`), so what it writes next can name that event as its
cause. Each moved call is counted (:func:`count_moves`) and logged (:func:`log_moves`).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Row,
    RowMapping,
    Text,
    and_,
    any_,
    bindparam,
    column,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.dml import Update
from sqlalchemy.sql.selectable import CTE

from dispatcher.db.tables import tool_calls
from dispatcher.errors import TransitionConflict
from dispatcher.ledger.batched import record_all
from dispatcher.ledger.events import (
    CallContext,
    EventType,
    event_row,
    record_events,
)
from dispatcher.ledger.logged import Logged, PayloadSql
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.summaries import execute_counted
from dispatcher.logs import TRANSITIONS_LOGGER
from dispatcher.metrics import TRANSITIONS
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import ExecutionStatus, check_transition

_transitions = logging.getLogger(TRANSITIONS_LOGGER)


@dataclass(frozen=True, slots=True)
class Fence:
    """What a mover saw of a call when it decided: the lease owner and the version
    (None: not checked). A move fenced by it changes nothing once either changed: a
    worker or reconciler whose claim was taken over learns so through
    :class:`TransitionConflict`."""

    owner: str | None = None
    version: int | None = None


@dataclass(frozen=True, slots=True)
class Moved:
    """A moved call: its row after the move, and the event (an ``execution_events``
    row's values) that records the move."""

    row: Row[Any]
    event: Mapping[str, Any]

    @property
    def event_id(self) -> str:
        event_id: str = self.event["event_id"]
        return event_id


async def move(
    session: AsyncSession,
    tool_call_id: str,
    *,
    tenant: str,
    expected: ExecutionStatus | Iterable[ExecutionStatus],
    target: ExecutionStatus,
    event_type: EventType,
    producer: Producer,
    fields: Mapping[str, Any] | None = None,
    payload: Mapping[str, Any] | None = None,
    causation_id: str | None = None,
    fence: Fence | None = None,
    topics: Topics = DEFAULT_TOPICS,
) -> Moved:
    """Move ``tenant``'s call from one of ``expected`` to ``target`` (unless ``fence`` no longer
    holds) and record ``event_type``; returns the updated row and the event."""
    sources = [expected] if isinstance(expected, ExecutionStatus) else list(expected)
    for source in sources:
        check_transition(source, target)

    this = (tool_calls.c.tenant == tenant, tool_calls.c.tool_call_id == tool_call_id)
    stmt = (
        update(tool_calls)
        .where(*this, tool_calls.c.status.in_([s.value for s in sources]))
        .values(
            status=target.value,
            version=tool_calls.c.version + 1,
            updated_at=func.now(),
            **dict(fields or {}),
        )
    )
    if fence is not None and fence.owner is not None:
        stmt = stmt.where(tool_calls.c.lease_owner == fence.owner)
    if fence is not None and fence.version is not None:
        stmt = stmt.where(tool_calls.c.version == fence.version)

    moved_rows = await execute_counted(
        session,
        stmt,
        returning=list(tool_calls.c),
        sources=sources,
        targets=[target],
        candidates=this,
    )
    row = moved_rows[0] if moved_rows else None
    if row is None:
        raise TransitionConflict(
            f"tool call {tool_call_id!r} is no longer in {[s.value for s in sources]}"
            " (or its lease/version changed)",
            toolCallId=tool_call_id,
            target=target.value,
        )
    count_moves(sources, [(row.status, row.capability_id)])
    event = event_row(
        event_type,
        CallContext.of(row._mapping),
        producer=producer,
        causation_id=causation_id,
        payload={"from": [s.value for s in sources], "to": target.value, **dict(payload or {})},
    )
    moved = Moved(row, event)
    log_moves(sources, [moved])
    await record_events(session, [event], topics=topics)
    return moved


def count_moves(sources: Sequence[ExecutionStatus], moved: Iterable[tuple[str, str]]) -> None:
    """Count the moves a statement made, ``(to, capability)`` each, from ``sources``.

    Counted when the statement returns its rows (what moved, not what was asked), in
    the mover's transaction: a transaction that then rolls back has counted moves that
    did not happen. Counting at commit would need a hook on every session's commit and
    its savepoints; the gap is small instead: movers commit right after, and a process
    that dies before the commit loses its counters with it. ``from`` is the one
    expected status, or all of them joined by ``|`` when several were (the UPDATE's
    RETURNING sees only the new row; the event records the same list).
    """
    came_from = "|".join(sorted(s.value for s in sources))
    for (to, capability), n in collections.Counter(moved).items():
        TRANSITIONS.labels(came_from, to, capability).inc(n)


def log_moves(sources: Sequence[ExecutionStatus], moved: Sequence[Moved]) -> None:
    """One INFO line per moved call on the ``tool_dispatcher.transitions`` logger, with
    ``from``, ``to``, ``tenant``, the call's ids and its stored trace's ``trace_id`` (a
    batch moves outside any one call's span, yet each line joins its call's trace).

    Where the moves are counted (:func:`count_moves`), with the same caveat: a line
    is written when the statement returned the row, before its transaction commits.
    A batch is hundreds of calls: nothing is built unless INFO is on for the logger,
    and the message is formatted only by a handler that writes it.
    """
    if not moved or not _transitions.isEnabledFor(logging.INFO):
        return
    came_from = "|".join(sorted(s.value for s in sources))
    for m in moved:
        e = m.event
        to = e["payload"]["to"]
        stored = getattr(m.row, "traceparent", None)  # "00-<trace id>-<span id>-<flags>"
        _transitions.info(
            "tool call %s (%s): %s -> %s",
            e["tool_call_id"],
            e["capability_id"],
            came_from,
            to,
            extra={
                "from": came_from,
                "to": to,
                "tenant": e["tenant"],
                "tool_call_id": e["tool_call_id"],
                "run_id": e["run_id"],
                "capability_id": e["capability_id"],
                "trace_id": stored[3:35] if stored else None,
            },
        )


def per_call_values(moves: Sequence[BulkMove], names: Sequence[str], *extra: Any) -> CTE:
    """Each move's key, version fence and ``names`` values (columns of ``tool_calls``,
    NULL where a move has none), plus the ``extra`` columns, as the CTE ``v``.

    They travel as ONE JSON parameter, so the statement's text does not change with
    the batch size: SQLAlchemy compiles it once per shape and psycopg prepares it once
    (a VALUES list would be a new statement for every size). MATERIALIZED: should the
    planner loop over the rows, it rescans a tuplestore rather than parse the JSON
    again for each of them.
    """
    rows = [
        {"tenant": m.tenant, "tool_call_id": m.tool_call_id, "fence_version": m.version, **m.values}
        for m in moves
    ]
    spec = (
        func.jsonb_to_recordset(bindparam("moves", rows, type_=JSONB))
        .table_valued(
            column("tenant", Text),
            column("tool_call_id", Text),
            column("fence_version", Integer),
            *(column(name, tool_calls.c[name].type) for name in names),
            *extra,
        )
        .render_derived(name="spec", with_types=True)
    )
    return select(spec).cte("v").prefix_with("MATERIALIZED")


def fenced_by(stmt: Update, v: CTE) -> Update:
    """``stmt`` limited to the calls of ``v`` (:func:`per_call_values`), each at its own
    version unless that is NULL."""
    return stmt.where(
        tool_calls.c.tenant == v.c.tenant,
        tool_calls.c.tool_call_id == v.c.tool_call_id,
        or_(v.c.fence_version.is_(None), tool_calls.c.version == v.c.fence_version),
    )


def _per_call(stmt: Update, moves: Sequence[BulkMove]) -> Update:
    """``stmt`` joined to each move's own key, version fence and column values (every
    move carries the same keys)."""
    names = sorted(moves[0].values)
    v = per_call_values(moves, names)
    stmt = fenced_by(stmt, v)
    return stmt.values({name: v.c[name] for name in names}) if names else stmt


def keys_of(moves: Sequence[BulkMove]) -> ColumnElement[bool]:
    """The moves' tenants and ids as arrays on the primary key's columns: a superset of
    the calls (every tenant with every id), joined exactly by :func:`fenced_by`. Not
    ``(tenant, tool_call_id) IN (SELECT unnest(...))``: on stale statistics the planner
    rescanned the batch for each row of the expected status (30 ms for 64 calls behind
    2,300, bench.dispatch); these are index conditions whatever the statistics say."""
    tenants = sorted({m.tenant for m in moves})
    return and_(
        tool_calls.c.tenant == any_(bindparam("tenants", tenants, type_=ARRAY(Text))),
        tool_calls.c.tool_call_id
        == any_(bindparam("ids", [m.tool_call_id for m in moves], type_=ARRAY(Text))),
    )


MOVED_COLUMNS = [
    tool_calls.c[name]
    for name in (
        "tool_call_id", "tenant", "run_id", "turn_id", "capability_id", "correlation_id",
        "reasoning_object_id", "idempotency_key", "provider_key", "status", "version",
        "external_request_id", "dispatch_attempts", "reconcile_attempts", "traceparent",
        "tool_name",
    )
]  # fmt: skip
"""What :func:`move_many` returns of each moved row: its identity, the context of its
events, and what a claim needs to send it but its input (not every column: a batch's
rows are decoded in Python, and results or timestamps are not needed). The input,
which can be large and is parsed from JSON, comes back only when asked for."""


@dataclass(frozen=True, slots=True)
class BulkMove:
    """One call of a :func:`move_many`: the version its mover saw (None: fenced by its
    status alone, as a claim of an ``authorized`` call is), its own column values
    (JSON-serializable), and its event's payload."""

    tool_call_id: str
    version: int | None = None
    values: Mapping[str, Any] = field(default_factory=dict)
    payload: Mapping[str, Any] = field(default_factory=dict)
    # A toolCallId is unique only within its tenant.
    tenant: str = field(kw_only=True)

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant, self.tool_call_id)


async def move_many(
    session: AsyncSession,
    moves: Sequence[BulkMove],
    *,
    expected: ExecutionStatus | Iterable[ExecutionStatus],
    target: ExecutionStatus,
    event_type: EventType,
    producer: Producer,
    lease_owner: str | None,
    fields: Mapping[str, Any] | None = None,
    where: Sequence[ColumnElement[bool]] = (),
    row_payload: Callable[[RowMapping], Mapping[str, Any]] | None = None,
    topics: Topics = DEFAULT_TOPICS,
    causation_id: str | None = None,
    with_input: bool = False,
    payload_sql: PayloadSql | None = None,
) -> list[Moved]:
    """:func:`move` for many calls, whatever their number: one conditional UPDATE (each
    row fenced by status, ``lease_owner`` unless None, its own version unless None, and
    ``where``), then one statement for the events and their outbox rows (none for an
    event of :data:`~dispatcher.ledger.events.LOG_ONLY`); with ``payload_sql``, the
    UPDATE's own statement writes the events (:mod:`dispatcher.ledger.logged`).

    Every move must carry the same ``values`` keys. A call that no longer matches its
    fence is skipped rather than failing the batch: its row is simply missing from
    the result, and the caller treats it as taken over. ``row_payload`` adds to each
    event's payload what only the moved row tells (``payload_sql``: the same in SQL).
    Each moved call comes back with its event. ``causation_id`` is every event's cause,
    if any. ``with_input``: each moved row also holds the call's input (a claim's).
    """
    if not moves:
        return []
    sources = [expected] if isinstance(expected, ExecutionStatus) else list(expected)
    for source in sources:
        check_transition(source, target)
    # Sorted, so concurrent batches lock shared rows in one order and cannot deadlock.
    ordered = sorted(moves, key=lambda m: m.key)
    keys = keys_of(ordered)
    stmt = _bulk_update(ordered, keys, sources, target, fields or {}, where, lease_owner)
    came_from = [s.value for s in sources]
    logged = payload_sql and Logged.of(
        moves, event_type, producer, came_from, target, payload_sql, causation_id
    )
    returning = [*MOVED_COLUMNS, *([tool_calls.c.input] if with_input else [])]
    moved = await execute_counted(
        session,
        stmt,
        returning=[*returning, *Logged.RETURNED] if logged else returning,
        sources=sources,
        targets=[target],
        candidates=[keys, *where],
        also=logged.inserted if logged else None,
    )
    count_moves(sources, [(row.status, row.capability_id) for row in moved])
    if logged:
        result = [Moved(row, logged.event(row, row_payload)) for row in moved]
        log_moves(sources, result)
        return result
    by_key = {m.key: m for m in moves}
    events = [
        event_row(
            event_type,
            CallContext.of(row._mapping),
            producer=producer,
            causation_id=causation_id,
            payload={
                "from": came_from,
                "to": target.value,
                **dict(by_key[(row.tenant, row.tool_call_id)].payload),
                **(row_payload(row._mapping) if row_payload else {}),
            },
        )
        for row in moved
    ]
    await record_all(session, events, topics)
    result = [Moved(row, event) for row, event in zip(moved, events, strict=True)]
    log_moves(sources, result)
    return result


def _bulk_update(
    ordered: Sequence[BulkMove],
    keys: ColumnElement[bool],
    sources: Sequence[ExecutionStatus],
    target: ExecutionStatus,
    fields: Mapping[str, Any],
    where: Sequence[ColumnElement[bool]],
    lease_owner: str | None,
) -> Update:
    """:func:`move_many`'s conditional UPDATE of the calls ``ordered`` names."""
    moved = {"status": target.value, "version": tool_calls.c.version + 1, "updated_at": func.now()}
    stmt = update(tool_calls).values(**moved, **dict(fields))
    stmt = stmt.where(keys, tool_calls.c.status.in_([s.value for s in sources]), *where)
    stmt = _per_call(stmt, ordered)  # the exact calls: keys_of names a superset
    if lease_owner is not None:
        stmt = stmt.where(tool_calls.c.lease_owner == lease_owner)
    return stmt
