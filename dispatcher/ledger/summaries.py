"""Each run's summary (``run_summaries``, :mod:`dispatcher.db.run_summaries`): its calls
counted by status, kept by the ledger in the transaction of every move.

**How a move is counted.** The statement that moves calls also adds to their runs'
summaries (:func:`counted`, a data-modifying CTE on the moved rows): for each run, one
more in each status a call arrived in, one fewer in the status it left. Intake's
statement does the same for the calls it creates (:mod:`dispatcher.intake.statement`).
A move and its count commit or roll back together, so the counts are exact, and a read
of them costs one row per run whatever the run's history.

**Locks.** Adding to a summary locks its row until the transaction ends, so two
transactions that move calls of one run take turns at its row (from their move to their
commit). No deadlock comes of it as long as every transaction takes its summary rows
last (after every call row it locks) and in (tenant, run_id) order: an upsert of many
runs reads its rows in that order, and a transaction of one move statement does the
rest by itself. A transaction of several moves (the reconciler's batch, a stop, the
recovery sweep) would take a summary row and then more call rows, so it counts in
:func:`deferred` instead: its moves are tallied in Python and added by ONE statement at
the end of the block, after its last call row lock.

**Removing calls** (retention): :func:`forget_calls`, in the transaction that deletes
them. **Counting again** from the calls (after a rollout in which the previous release
moved calls without counting): :func:`recount`.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Integer,
    Row,
    Select,
    Text,
    bindparam,
    case,
    column,
    delete,
    func,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.postgresql.dml import Insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.dml import Update
from sqlalchemy.sql.selectable import CTE

from dispatcher.db.run_summaries import COUNTED
from dispatcher.db.tables import run_summaries, runs, tool_calls
from dispatcher.states import ExecutionStatus

RunKey = tuple[str, str]
"""(tenant, run_id)"""

_PENDING = "dispatcher.ledger.summaries.pending"
"""The key of the open :func:`deferred` block's :class:`Tally` in ``session.info``."""


def _upsert(rows: Select[Any], columns: Sequence[str], *, touch: bool = True) -> Insert:
    """Add ``rows`` (``tenant``, ``run_id``, then a delta per name of ``columns``, and
    ``stopped_at`` when it is among them) to the summaries, inserting a run's row the
    first time. ``rows`` must come in (tenant, run_id) order: the rows are locked in
    the order they are read (see the module docstring). ``touch``: the run changed
    (``updated_at``); a removal of old calls is not a change of the run."""
    stmt = pg_insert(run_summaries).from_select(["tenant", "run_id", *columns], rows)
    added: dict[str, Any] = {
        c: run_summaries.c[c] + stmt.excluded[c] for c in columns if c != "stopped_at"
    }
    if "stopped_at" in columns:
        added["stopped_at"] = func.coalesce(run_summaries.c.stopped_at, stmt.excluded.stopped_at)
    if touch:
        added["updated_at"] = func.now()
    return stmt.on_conflict_do_update(
        index_elements=[run_summaries.c.tenant, run_summaries.c.run_id], set_=added
    )


def counted(
    moved: CTE, sources: Sequence[ExecutionStatus], targets: Iterable[ExecutionStatus]
) -> CTE:
    """The CTE that counts the moves of ``moved`` (the moved rows' ``tenant``,
    ``run_id`` and new ``status``; and ``came_from``, the status each left, when there
    are several ``sources``) in their runs' summaries, one upsert of one row per run.

    Add it to the moving statement (PostgreSQL runs a data-modifying CTE whether or not
    the statement reads it)."""
    statuses = sorted({*sources, *targets}, key=COUNTED.index)
    came_from = moved.c.came_from if len(sources) > 1 else None

    def delta(status: ExecutionStatus) -> ColumnElement[Any]:
        arrived = func.count().filter(moved.c.status == status.value)
        if came_from is not None:
            return arrived - func.count().filter(came_from == status.value)
        return arrived - func.count() if status is sources[0] else arrived

    rows = (
        select(moved.c.tenant, moved.c.run_id, *(delta(s).label(s.value) for s in statuses))
        .group_by(moved.c.tenant, moved.c.run_id)
        .order_by(moved.c.tenant, moved.c.run_id)
    )
    return _upsert(rows, [s.value for s in statuses]).cte("counted")


async def execute_counted(
    session: AsyncSession,
    stmt: Update,
    *,
    returning: Sequence[ColumnElement[Any]],
    sources: Sequence[ExecutionStatus],
    targets: Iterable[ExecutionStatus],
    candidates: Sequence[ColumnElement[bool]],
    also: Callable[[CTE], CTE] | None = None,
) -> list[Row[Any]]:
    """Run ``stmt``, an UPDATE of ``tool_calls`` that moves calls out of ``sources``
    into ``targets``, with its moves counted (:func:`counted`, or the open
    :func:`deferred` block's tally); ``returning`` of each moved row, and ``came_from``
    when there are several sources. ``also``: a data-modifying CTE over the moved rows
    that the same statement runs (their events).

    An UPDATE's RETURNING sees only the new row, so with several sources the rows are
    first locked, in key order, to read the status each leaves (``candidates`` select
    a superset of the rows ``stmt`` moves); a concurrent move of one of them is waited
    for, and its status read as it committed."""
    extra: list[ColumnElement[Any]] = [tool_calls.c.run_id, tool_calls.c.status]
    if len(sources) > 1:
        was = (
            select(tool_calls.c.tenant, tool_calls.c.tool_call_id, tool_calls.c.status)
            .where(*candidates, tool_calls.c.status.in_([s.value for s in sources]))
            .order_by(tool_calls.c.tenant, tool_calls.c.tool_call_id)
            .with_for_update(key_share=True)
            .cte("was")
        )
        stmt = stmt.where(
            tool_calls.c.tenant == was.c.tenant, tool_calls.c.tool_call_id == was.c.tool_call_id
        )
        extra.append(was.c.status.label("came_from"))
    names = {str(r.key) for r in returning}
    listed = [*returning, *(c for c in extra if str(c.key) not in names)]
    moved = stmt.returning(*listed).cte("moved")
    query: Select[Any] = select(*(moved.c[str(c.key)] for c in listed))
    tally = pending(session)
    if tally is None:
        query = query.add_cte(counted(moved, sources, targets))
    if also is not None:
        query = query.add_cte(also(moved))
    rows = list((await session.execute(query)).all())
    if tally is not None:
        for r in rows:
            came_from = r.came_from if len(sources) > 1 else sources[0].value
            tally.move(r.tenant, r.run_id, came_from, r.status)
    return rows


@dataclass
class Tally:
    """Moves counted in Python, to be added to the summaries by one statement
    (:func:`apply`): a delta per (tenant, run_id, status), and the runs stopped."""

    deltas: collections.Counter[tuple[str, str, str]] = field(default_factory=collections.Counter)
    stopped: set[RunKey] = field(default_factory=set)

    def move(self, tenant: str, run_id: str, came_from: str | None, to: str | None) -> None:
        """One call of the run left ``came_from`` (None: it is new) for ``to`` (None:
        it is gone)."""
        if came_from is not None:
            self.deltas[(tenant, run_id, came_from)] -= 1
        if to is not None:
            self.deltas[(tenant, run_id, to)] += 1

    def merge(self, other: Tally) -> None:
        self.deltas.update(other.deltas)
        self.stopped |= other.stopped

    def rows(self) -> list[dict[str, Any]]:
        """One JSON row per run, every count column present, in (tenant, run_id) order."""
        by_run: dict[RunKey, dict[str, Any]] = {key: {} for key in self.stopped}
        for (tenant, run_id, status), n in self.deltas.items():
            by_run.setdefault((tenant, run_id), {})[status] = n
        return [
            {
                "tenant": tenant,
                "run_id": run_id,
                **{s.value: counts.get(s.value, 0) for s in COUNTED},
                "stopped": (tenant, run_id) in self.stopped,
            }
            for (tenant, run_id), counts in sorted(by_run.items())
        ]


def pending(session: AsyncSession) -> Tally | None:
    """The tally of the :func:`deferred` block open on ``session``, if one is: a move
    adds to it instead of counting in its own statement."""
    found: Tally | None = session.info.get(_PENDING)
    return found


@asynccontextmanager
async def deferred(session: AsyncSession) -> AsyncIterator[Tally]:
    """Count the moves made on ``session`` inside the block by one statement at its
    end, rather than each in its own (see the module docstring: a transaction of several
    moves). Nothing is counted if the block raises; a block inside another adds its
    tally to the outer one's (a savepoint inside a transaction: it counts only if it is
    released)."""
    outer = pending(session)
    tally = Tally()
    session.info[_PENDING] = tally
    try:
        yield tally
    finally:
        session.info[_PENDING] = outer
    if outer is not None:
        outer.merge(tally)
    else:
        await apply(session, tally)


_SPEC: list[ColumnElement[Any]] = [
    column("tenant", Text),
    column("run_id", Text),
    *(column(s.value, Integer) for s in COUNTED),
    column("stopped", Boolean),
]


async def apply(session: AsyncSession, tally: Tally, *, touch: bool = True) -> None:
    """Add ``tally`` to the summaries, in one statement (its runs in order)."""
    rows = tally.rows()
    if not rows:
        return
    d = (
        func.jsonb_to_recordset(bindparam("deltas", rows, type_=JSONB))
        .table_valued(*_SPEC)
        .render_derived(name="d", with_types=True)
    )
    query = select(
        d.c.tenant,
        d.c.run_id,
        *(d.c[s.value] for s in COUNTED),
        case((d.c.stopped, func.now())).label("stopped_at"),
    ).order_by(d.c.tenant, d.c.run_id)
    columns = [s.value for s in COUNTED] + ["stopped_at"]
    await session.execute(_upsert(query, columns, touch=touch))


def note_stopped(session: AsyncSession, tenant: str, run_id: str) -> None:
    """Record in the open :func:`deferred` block that the run was stopped (its summary
    says so from the block's end). The stop command runs in such a block."""
    tally = pending(session)
    if tally is None:
        raise RuntimeError("a run's stop is counted at the end of a deferred() block")
    tally.stopped.add((tenant, run_id))


async def forget_calls(
    session: AsyncSession, tenant: str, calls: Iterable[tuple[str, str]]
) -> None:
    """Take calls that were deleted out of their runs' summaries: ``calls`` holds the
    ``(run_id, status)`` of each, the status it had when it was deleted. A run left with
    no call loses its summary too (it is no longer listed).

    For retention, in the transaction that deletes the calls, after the delete and as
    the transaction's last write: the calls' rows must be locked (FOR UPDATE, or the
    DELETE) before their statuses are read, so that no move slips in between, and the
    summary rows are taken last (see the module docstring). The run's ``updated_at``
    stays: removing its old calls is no change of the run."""
    listed = list(calls)
    tally = Tally()
    for run_id, status in listed:
        tally.move(tenant, run_id, ExecutionStatus(status).value, None)
    await apply(session, tally, touch=False)
    emptied = sorted({run_id for run_id, _ in listed})
    if emptied:
        await session.execute(
            delete(run_summaries).where(
                run_summaries.c.tenant == tenant,
                run_summaries.c.run_id.in_(emptied),
                run_summaries.c.calls == 0,
            )
        )


async def recount(session: AsyncSession, tenant: str | None = None) -> int:
    """Count every run's calls again from ``tool_calls`` (of ``tenant``, or of every
    tenant) and write the counts over the summaries; returns the runs written.

    Exact while calls move: it first locks ``run_summaries`` against every writer
    (SHARE ROW EXCLUSIVE; readers go on), then counts on a snapshot taken after the
    lock. A move that committed before is in the snapshot and its count in the table; a
    move not yet committed is in neither, and adds its count once this commits. Every
    move waits meanwhile: the count reads all the calls (a few seconds per million).
    The caller commits."""
    await session.execute(text("LOCK TABLE run_summaries IN SHARE ROW EXCLUSIVE MODE"))
    mine = [tool_calls.c.tenant == tenant] if tenant is not None else []
    of_run = (runs.c.tenant == tool_calls.c.tenant) & (runs.c.run_id == tool_calls.c.run_id)
    found = (
        select(
            tool_calls.c.tenant,
            tool_calls.c.run_id,
            *(func.count().filter(tool_calls.c.status == s.value).label(s.value) for s in COUNTED),
            func.min(tool_calls.c.created_at).label("created_at"),
            func.max(tool_calls.c.updated_at).label("updated_at"),
            func.min(runs.c.stopped_at).label("stopped_at"),
        )
        .select_from(tool_calls.outerjoin(runs, of_run))
        .where(*mine)
        .group_by(tool_calls.c.tenant, tool_calls.c.run_id)
        .order_by(tool_calls.c.tenant, tool_calls.c.run_id)
    )
    names = [s.value for s in COUNTED] + ["created_at", "updated_at", "stopped_at"]
    stmt = pg_insert(run_summaries).from_select(["tenant", "run_id", *names], found)
    written = await session.execute(
        stmt.on_conflict_do_update(
            index_elements=[run_summaries.c.tenant, run_summaries.c.run_id],
            set_={
                **{s.value: stmt.excluded[s.value] for s in COUNTED},
                "updated_at": func.greatest(run_summaries.c.updated_at, stmt.excluded.updated_at),
                "stopped_at": func.coalesce(run_summaries.c.stopped_at, stmt.excluded.stopped_at),
            },
        ).returning(run_summaries.c.run_id)
    )
    count = len(written.all())
    # A summary none of whose calls is left (they were deleted by someone who did not
    # say so) is dropped, unless it tells of a stop.
    left = select(tool_calls.c.run_id).where(
        tool_calls.c.tenant == run_summaries.c.tenant, tool_calls.c.run_id == run_summaries.c.run_id
    )
    gone = delete(run_summaries).where(~left.exists(), run_summaries.c.stopped_at.is_(None))
    if tenant is not None:
        gone = gone.where(run_summaries.c.tenant == tenant)
    await session.execute(gone)
    # Many rows were just written: without statistics the planner reads a whole
    # tenant's runs for a page (a bitmap scan and a sort) instead of a range of the index.
    await session.execute(text("ANALYZE run_summaries"))
    return count
