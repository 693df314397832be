"""The escalation queue over HTTP: list (``read``), acknowledge and resolve
(``operate``), tenant-scoped like every other route."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated

from fastapi import FastAPI, Query, Request, Response
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.api.auth import ApiKeyAuth
from dispatcher.api.bodies import parse_body
from dispatcher.control import escalations
from dispatcher.control.escalations import ResolveRequest
from dispatcher.settings import Settings
from dispatcher.states import EscalationStatus

JSON = "application/json"
Sessions = Callable[[], async_sessionmaker[AsyncSession]]


def add_escalation_routes(
    app: FastAPI, auth: ApiKeyAuth, sessions: Sessions, settings: Settings
) -> None:
    """Add ``/v1/escalations`` routes; ``sessions`` returns the app's session factory
    (it exists only once the lifespan started)."""

    @app.get("/v1/escalations")
    async def list_escalations(
        request: Request,
        status: Annotated[EscalationStatus | None, Query()] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> Response:
        principal = auth.authenticate(request)
        principal.require("read")
        async with sessions()() as session:
            found = await escalations.list_escalations(
                session, tenant=principal.tenant, status=status, limit=limit
            )
        body = [e.model_dump(by_alias=True, mode="json") for e in found]
        return Response(json.dumps({"escalations": body}), media_type=JSON)

    @app.post("/v1/escalations/{escalation_id}/acknowledge")
    async def acknowledge(escalation_id: str, request: Request) -> Response:
        principal = auth.authenticate(request)
        principal.require("operate")
        async with sessions()() as session, session.begin():
            view = await escalations.acknowledge(
                session,
                escalation_id,
                actor=principal.actor(),
                tenant=principal.tenant,
                events_topic=settings.events_topic,
            )
        return Response(view.model_dump_json(by_alias=True), media_type=JSON)

    @app.post("/v1/escalations/{escalation_id}/resolve")
    async def resolve(escalation_id: str, request: Request) -> Response:
        principal = auth.authenticate(request)
        principal.require("operate")
        body = parse_body(ResolveRequest, await request.body(), "resolution")
        async with sessions()() as session, session.begin():
            view = await escalations.resolve(
                session,
                escalation_id,
                finding=body.finding,
                reason=body.reason,
                actor=principal.actor(),
                tenant=principal.tenant,
                events_topic=settings.events_topic,
                escalations_topic=settings.escalations_topic,
            )
        return Response(view.model_dump_json(by_alias=True), media_type=JSON)
