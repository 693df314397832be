"""Approvals over HTTP: list (``read``) and decide (``approve``), tenant-scoped."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated

from fastapi import FastAPI, Query, Request, Response
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.api.auth import ApiKeyAuth
from dispatcher.api.bodies import parse_body
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control import approvals
from dispatcher.control.approvals import DecisionRequest
from dispatcher.settings import Settings
from dispatcher.states import ApprovalStatus

JSON = "application/json"
Sessions = Callable[[], async_sessionmaker[AsyncSession]]


def add_approval_routes(
    app: FastAPI,
    auth: ApiKeyAuth,
    sessions: Sessions,
    settings: Settings,
    registry: CapabilityRegistry,
) -> None:
    """Add ``/v1/approvals`` routes; ``sessions`` returns the app's session factory."""

    @app.get("/v1/approvals")
    async def list_approvals(
        request: Request,
        status: Annotated[ApprovalStatus | None, Query()] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> Response:
        principal = auth.authenticate(request)
        principal.require("read")
        async with sessions()() as session:
            found = await approvals.list_approvals(
                session, tenant=principal.tenant, status=status, limit=limit
            )
        body = [a.model_dump(by_alias=True, mode="json") for a in found]
        return Response(json.dumps({"approvals": body}), media_type=JSON)

    @app.post("/v1/approvals/{approval_id}/decision")
    async def decide(approval_id: str, request: Request) -> Response:
        principal = auth.authenticate(request)
        principal.require("approve")
        body = parse_body(DecisionRequest, await request.body(), "decision")
        async with sessions()() as session, session.begin():
            view = await approvals.decide(
                session,
                approval_id,
                body,
                actor=principal.actor(),
                scopes=principal.scopes,
                tenant=principal.tenant,
                registry=registry,
                dispatch_topic=settings.dispatch_topic,
                events_topic=settings.events_topic,
            )
        return Response(view.model_dump_json(by_alias=True), media_type=JSON)
