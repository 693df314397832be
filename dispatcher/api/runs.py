"""Runs over HTTP: the run view and its event log (``read``), and stopping a run
(``operate``), tenant-scoped."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from dispatcher.api.bodies import json_response, model_response, parse_body
from dispatcher.api.deps import AppSettings, Operator, Reader, Registry, Sessions
from dispatcher.api.params import EventCursor, RunIdPath
from dispatcher.control import runs
from dispatcher.schemas import StopRequest
from dispatcher.views.run_view import load_run_view, run_events

router = APIRouter()


@router.get("/v1/runs/{run_id}")
async def run_view(run_id: RunIdPath, caller: Reader, sessions: Sessions) -> Response:
    async with sessions() as session:
        view = await load_run_view(session, caller.tenant, run_id)
    return model_response(view)


@router.get("/v1/runs/{run_id}/events")
async def run_event_log(
    run_id: RunIdPath,
    caller: Reader,
    sessions: Sessions,
    after: EventCursor = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> Response:
    async with sessions() as session:
        found = await run_events(session, caller.tenant, run_id, after=after, limit=limit)
    events = [e.model_dump(by_alias=True, mode="json") for e in found]
    return json_response(json.dumps({"runId": run_id, "events": events}))


@router.post("/v1/runs/{run_id}/stop")
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
