"""Runs and control commands over HTTP: the run view and the run's event log
(``read``), stop a run and retry a call (``operate``), tenant-scoped."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import FastAPI, Query, Request, Response

from dispatcher.api.approvals import Sessions
from dispatcher.api.auth import ApiKeyAuth
from dispatcher.api.bodies import parse_body
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control import retry as control
from dispatcher.control import runs
from dispatcher.schemas import RetryRequest, StopRequest
from dispatcher.settings import Settings
from dispatcher.views.run_view import load_run_view
from dispatcher.views.run_view import run_events as read_run_events

JSON = "application/json"


def add_run_routes(
    app: FastAPI,
    auth: ApiKeyAuth,
    sessions: Sessions,
    settings: Settings,
    registry: CapabilityRegistry,
) -> None:
    """Add ``GET /v1/runs/{runId}``, ``GET /v1/runs/{runId}/events``,
    ``POST /v1/runs/{runId}/stop`` and ``POST /v1/tool-calls/{toolCallId}/retry``."""

    @app.get("/v1/runs/{run_id}")
    async def run_view(run_id: str, request: Request) -> Response:
        principal = auth.authenticate(request)
        principal.require("read")
        async with sessions()() as session:
            view = await load_run_view(session, principal.tenant, run_id)
        return Response(view.model_dump_json(by_alias=True), media_type=JSON)

    @app.post("/v1/runs/{run_id}/stop")
    async def stop(run_id: str, request: Request) -> Response:
        principal = auth.authenticate(request)
        principal.require("operate")
        body = parse_body(StopRequest, await request.body(), "stop request")
        async with sessions()() as session, session.begin():
            outcome = await runs.stop_run(
                session,
                tenant=principal.tenant,
                run_id=run_id,
                actor=principal.actor(),
                reason=body.reason,
                registry=registry,
                events_topic=settings.events_topic,
            )
        return Response(json.dumps(outcome.model_dump(by_alias=True, mode="json")), media_type=JSON)

    @app.post("/v1/tool-calls/{tool_call_id}/retry")
    async def retry(tool_call_id: str, request: Request) -> Response:
        principal = auth.authenticate(request)
        principal.require("operate")
        body = parse_body(RetryRequest, await request.body(), "retry request")
        async with sessions()() as session, session.begin():
            view = await control.retry_call(
                session,
                tool_call_id,
                body,
                tenant=principal.tenant,
                actor=principal.actor(),
                dispatch_topic=settings.dispatch_topic,
                events_topic=settings.events_topic,
            )
        return Response(view.model_dump_json(by_alias=True), media_type=JSON)

    @app.get("/v1/runs/{run_id}/events")
    async def run_events(
        run_id: str,
        request: Request,
        after: Annotated[str | None, Query(description="return events after this eventId")] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> Response:
        principal = auth.authenticate(request)
        principal.require("read")
        async with sessions()() as session:
            found = await read_run_events(
                session, principal.tenant, run_id, after=after, limit=limit
            )
        events = [e.model_dump(by_alias=True, mode="json") for e in found]
        return Response(json.dumps({"runId": run_id, "events": events}), media_type=JSON)
