"""Runs over HTTP: the list of runs, the run view and its event log (``read``), and
stopping a run (``operate``), tenant-scoped."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from dispatcher.api.bodies import model_response, parse_body
from dispatcher.api.deps import AppSettings, Operator, Reader, Registry, Sessions
from dispatcher.api.openapi import NOT_ROUTED, documented
from dispatcher.api.params import AfterCursor, EventCursor, RunIdPath
from dispatcher.control import runs
from dispatcher.errors import RunNotFound
from dispatcher.schemas import EventLog, StopRequest, StopResult
from dispatcher.views import run_list
from dispatcher.views.run_list import RunList
from dispatcher.views.run_view import RunView, load_run_view, run_events

router = APIRouter()


@router.get("/v1/runs", **documented(answer=RunList))
async def list_runs(
    caller: Reader,
    sessions: Sessions,
    busy: Annotated[
        bool | None,
        Query(description="only the busy runs (true), or only the others (false)"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    after: AfterCursor = None,
) -> Response:
    """The tenant's runs, newest first, from their summaries (a keyset page)."""
    position = run_list.parse_run_after(after) if after is not None else None
    async with sessions() as session:
        # One more than the page: its presence says a next page exists, without a count.
        found = await run_list.list_runs(
            session, caller.tenant, busy=busy, limit=limit + 1, after=position
        )
    page = found[:limit]
    following = run_list.run_position(page[-1]).token() if len(found) > limit else None
    return model_response(RunList(runs=page, next=following))


@router.get("/v1/runs/{run_id}", **documented(RunNotFound, answer=RunView))
async def run_view(run_id: RunIdPath, caller: Reader, sessions: Sessions) -> Response:
    async with sessions() as session:
        view = await load_run_view(session, caller.tenant, run_id)
    return model_response(view)


@router.get("/v1/runs/{run_id}/events", **documented(RunNotFound, answer=EventLog))
async def run_event_log(
    run_id: RunIdPath,
    caller: Reader,
    sessions: Sessions,
    after: EventCursor = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> Response:
    async with sessions() as session:
        found = await run_events(session, caller.tenant, run_id, after=after, limit=limit)
    return model_response(EventLog(run_id=run_id, events=found))


@router.post(
    "/v1/runs/{run_id}/stop",
    # A run nobody has heard of can be stopped too: only a path no route takes is 404.
    **documented(NOT_ROUTED, body=StopRequest, body_required=False, answer=StopResult),
)
async def stop(
    run_id: RunIdPath,
    request: Request,
    caller: Operator,
    sessions: Sessions,
    settings: AppSettings,
    registry: Registry,
) -> Response:
    body = parse_body(StopRequest, await request.body(), "stop request")
    async with sessions() as session, session.begin():
        outcome = await runs.stop_run(
            session,
            tenant=caller.tenant,
            run_id=run_id,
            actor=caller.actor(),
            reason=body.reason,
            registry=registry,
            topics=settings.topics(),
        )
    return model_response(outcome)
