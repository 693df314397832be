"""The ``run_summaries`` table: each run's calls counted by status, so a list of runs
reads one row per run, never the run's calls.

One integer column per execution status, named after it, rather than one jsonb of
counts: the row is rewritten on every move of every call of the run, and adding to two
integers in place is the cheapest rewrite there is (a jsonb would be parsed, merged and
serialized again each time); ``calls`` and ``busy`` are generated from the counts, so
no writer can let them drift. A new status needs a migration either way (the CHECK of
``tool_calls.status`` lists them).

Listed newest run first by ``created_at`` (when its first call was recorded), never by
``updated_at``: no index holds a column that every move changes, so a move rewrites the
row in place (a HOT update, on a page kept 80% full for it) instead of writing a new
entry in each index; and a run's place in the list never moves, so a walk through the
pages meets every run exactly once even while its calls move.

Written only by the ledger (:mod:`dispatcher.ledger.summaries`) and intake's statement,
in the transaction of the move they count.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import (
    Boolean,
    Column,
    Computed,
    DateTime,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    func,
)

from dispatcher.states import BUSY_STATES, ExecutionStatus

COUNTED: tuple[ExecutionStatus, ...] = tuple(ExecutionStatus)
"""A column each, named after the status."""

FILLFACTOR = 80
"""Room on each page for the row's next version, so that an update stays a HOT one."""


def total_of(statuses: Iterable[ExecutionStatus]) -> str:
    """The SQL sum of the count columns of ``statuses``."""
    return " + ".join(s.value for s in sorted(statuses, key=COUNTED.index))


def run_summaries_table(metadata: MetaData) -> Table:
    """The table, on ``metadata`` (:mod:`dispatcher.db.tables` holds it as
    ``run_summaries``)."""
    return Table(
        "run_summaries",
        metadata,
        Column("tenant", Text, primary_key=True),
        Column("run_id", Text, primary_key=True),
        *(Column(s.value, Integer, nullable=False, server_default="0") for s in COUNTED),
        Column("calls", Integer, Computed(total_of(COUNTED), persisted=True), nullable=False),
        # The same "busy" as the run's view (dispatcher.views.run_view) says.
        Column(
            "busy",
            Boolean,
            Computed(f"{total_of(BUSY_STATES)} > 0", persisted=True),
            nullable=False,
        ),
        # When the run's first call was recorded (or its stop, for a run stopped before
        # any call): the list's order. updated_at: the last move of one of its calls.
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("stopped_at", DateTime(timezone=True)),
        # The list, newest first, and the same of the busy runs or of the others: a page
        # is a range of one of these. busy changes only when the run starts or stops
        # being busy, so most moves leave both indexes alone.
        Index("ix_run_summaries_recent", "tenant", "created_at", "run_id"),
        Index("ix_run_summaries_busy", "tenant", "busy", "created_at", "run_id"),
        postgresql_with={"fillfactor": FILLFACTOR},
    )
