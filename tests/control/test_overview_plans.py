"""The console's overview reloads itself every few seconds: each of its figures reads
the tenant's live rows, whatever the history, in the plan PostgreSQL runs (50,000 calls
of history, 300 of them in flight). Counting the tenant's calls of every status would
read all 16,667 of them on every reload."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.views import overview
from tests.fixtures.history import HISTORY_CALLS, LIVE_EVERY
from tests.fixtures.plans import explain

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
LIVE = 6 * HISTORY_CALLS // LIVE_EVERY
"""Rows in flight of every kind among the history, every tenant's: 300 calls, fewer
pending approvals, unresolved escalations and unpublished messages."""


async def test_every_figure_of_the_overview_reads_the_live_set_only(history: Sessions) -> None:
    read: dict[str, tuple[int, set[str]]] = {}
    async with history() as session:
        for name, statement in overview.overview_queries("acme").items():
            plan = await explain(session, statement)
            read[name] = (plan.rows_examined, plan.seq_scans)
        nav = await explain(session, overview.nav_counts_query("acme"))
        read["nav_counts"] = (nav.rows_examined, nav.seq_scans)
    too_much = {name: found for name, found in read.items() if found[0] > LIVE or found[1]}
    assert too_much == {}
    # The calls by status and the oldest unknown from the index of the live set: the
    # tenant's third of it.
    assert read["by_status"][0] <= LIVE // 3


async def test_the_overview_counts_the_calls_in_flight(history: Sessions) -> None:
    async with history() as session:
        figures = await overview.load_overview(session, "acme")
    # 50 calls in each in-flight status, one in three of them acme's.
    assert set(figures.by_status) == {
        "proposed", "authorized", "dispatching", "accepted", "result_unknown", "escalated",
    }  # fmt: skip
    assert all(16 <= n <= 17 for n in figures.by_status.values()), figures.by_status
    assert figures.oldest_unknown_at is not None
