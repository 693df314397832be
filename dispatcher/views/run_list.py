"""The tenant's runs, a keyset page at a time, read from their summaries
(``run_summaries``, kept by :mod:`dispatcher.ledger.summaries`): ``GET /v1/runs`` and
the console's runs page.

Newest run first, by when its first call was recorded (``createdAt``), the run id
breaking ties. A page is a range of ``ix_run_summaries_recent`` (or, filtered by
``busy``, of ``ix_run_summaries_busy``) read after the position where the page before
ended (:mod:`dispatcher.views.cursors`): it reads its own rows, never a call, however
long the tenant's history (``tests/control/test_run_list_plans.py``). Why this order and
not the last change: a run's place never moves, so a walk through the pages meets every
run exactly once while its calls move, and a move updates no index
(:mod:`dispatcher.db.run_summaries`)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from sqlalchemy import Select, literal, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.run_summaries import COUNTED
from dispatcher.db.tables import run_summaries
from dispatcher.states import ExecutionStatus
from dispatcher.views.cursors import Position


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class RunSummaryView(_View):
    """One run as its summary tells it."""

    run_id: str
    calls_by_status: dict[ExecutionStatus, int] = Field(
        description="the run's calls by execution status; a status no call is in is left out"
    )
    calls: int
    is_busy: bool = Field(
        description="a call of the run is authorized, dispatching, accepted or"
        " result_unknown (the service is working on it): as GET /v1/runs/{runId} says"
    )
    created_at: datetime = Field(description="when the run's first call was recorded")
    updated_at: datetime = Field(description="the last move of one of its calls, or its stop")
    stopped: bool
    stopped_at: datetime | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> RunSummaryView:
        return cls(
            run_id=row["run_id"],
            calls_by_status={s: row[s.value] for s in COUNTED if row[s.value]},
            calls=row["calls"],
            is_busy=row["busy"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            stopped=row["stopped_at"] is not None,
            stopped_at=row["stopped_at"],
        )


class RunList(_View):
    """The answer of ``GET /v1/runs``, newest run first: ``next`` is the ``after`` of
    the next page (an opaque cursor), null on the last one."""

    runs: list[RunSummaryView]
    next: str | None


def runs_query(
    tenant: str, *, busy: bool | None = None, limit: int = 50, after: Position | None = None
) -> Select[Any]:
    """The tenant's runs (only the busy ones, or only the others, when ``busy`` says),
    newest first, after ``after`` (:func:`run_position`), up to ``limit``."""
    order = (run_summaries.c.created_at, run_summaries.c.run_id)
    query = (
        select(run_summaries)
        .where(run_summaries.c.tenant == tenant)
        .order_by(*(c.desc() for c in order))
        .limit(limit)
    )
    if busy is not None:
        query = query.where(run_summaries.c.busy.is_(busy))
    if after is not None:
        # A row comparison: one index condition, where "a < x OR (a = x AND b < y)"
        # would not be.
        query = query.where(tuple_(*order) < tuple_(literal(after.at), literal(after.id)))
    return query


async def list_runs(
    session: AsyncSession,
    tenant: str,
    *,
    busy: bool | None = None,
    limit: int = 50,
    after: Position | None = None,
) -> list[RunSummaryView]:
    """The tenant's runs (:func:`runs_query`)."""
    query = runs_query(tenant, busy=busy, limit=limit, after=after)
    return [RunSummaryView.of(r._mapping) for r in await session.execute(query)]


def run_position(view: RunSummaryView) -> Position:
    """Where a page that ends with ``view`` ends (the ``after`` of the next page)."""
    return Position(view.created_at, view.run_id)


def parse_run_after(token: str) -> Position:
    """The position an ``after`` token of the runs list names (``ValidationFailed`` if
    none)."""
    return Position.parse(token)
