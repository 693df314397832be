"""The reconciler's gauges read the live set, whatever the history: on 50,000 calls of
which 300 are in flight (and 2,050 escalations of which 50 are unresolved), each of
their statements reads about the rows it counts, in the plan PostgreSQL runs. A count
of every status (``GROUP BY status`` over ``tool_calls``) would read all 50,000."""

from __future__ import annotations

import psycopg
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.states import IN_FLIGHT_STATES, TERMINAL_STATES, ExecutionStatus
from reconciler import metrics
from tests.fixtures.history import HISTORY_CALLS, LIVE_EVERY
from tests.fixtures.metrics import sample
from tests.fixtures.plans import explain

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
IN_FLIGHT = len(IN_FLIGHT_STATES) * HISTORY_CALLS // LIVE_EVERY
"""The calls in flight among the history (50 in each in-flight status)."""
UNRESOLVED = 50
"""The escalations not resolved: the escalated calls'."""


async def read(history: Sessions, statement: Select[object]) -> tuple[int, set[str], set[str]]:
    async with history() as session:
        plan = await explain(session, statement)
    return plan.rows_examined, plan.indexes, plan.seq_scans


async def test_the_calls_gauge_reads_the_calls_in_flight_only(history: Sessions) -> None:
    rows, indexes, seq_scans = await read(history, metrics.calls_in_flight_query())
    assert rows <= IN_FLIGHT, (rows, IN_FLIGHT)
    assert (seq_scans, indexes) == (set(), {"ix_tool_calls_in_flight"})


async def test_the_open_escalations_gauge_reads_the_unresolved_ones_only(
    history: Sessions,
) -> None:
    rows, indexes, seq_scans = await read(history, metrics.open_escalations_query())
    assert rows <= UNRESOLVED, rows
    assert (seq_scans, indexes) == (set(), {"ix_escalations_status"})


async def test_the_backlog_gauge_reads_the_calls_to_reconcile_only(history: Sessions) -> None:
    rows, indexes, seq_scans = await read(history, metrics.backlog_query())
    # accepted and result_unknown: what the reconciler follows up.
    assert rows <= 2 * HISTORY_CALLS // LIVE_EVERY, rows
    assert (seq_scans, indexes) == (set(), {"ix_tool_calls_reconcile_due"})


async def test_the_gauges_report_the_calls_in_flight_and_no_finished_status(
    history: Sessions,
) -> None:
    await metrics.refresh(history)
    per_status = HISTORY_CALLS // LIVE_EVERY
    for status in IN_FLIGHT_STATES:
        assert sample("tool_dispatcher_calls", status=status.value) == per_status, status
    for status in TERMINAL_STATES:
        assert REGISTRY.get_sample_value("tool_dispatcher_calls", {"status": status}) is None
    assert REGISTRY.get_sample_value("tool_dispatcher_reconciler_open_escalations") == UNRESOLVED


def test_the_in_flight_index_holds_exactly_the_states_a_call_can_still_leave(
    history_database: str,
) -> None:
    """The index's predicate as the migration wrote it, against the enum: a state added
    to ExecutionStatus, or one that became final, shows here."""
    with psycopg.connect(history_database) as conn:
        found = conn.execute(
            "SELECT pg_get_expr(indpred, indrelid) FROM pg_index"
            " WHERE indexrelid = 'ix_tool_calls_in_flight'::regclass"
        ).fetchone()
    assert found is not None
    listed = {s for s in ExecutionStatus if f"'{s.value}'::text" in found[0]}
    assert listed == set(IN_FLIGHT_STATES) == set(ExecutionStatus) - TERMINAL_STATES
