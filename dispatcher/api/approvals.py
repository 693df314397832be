"""Approvals over HTTP: list (``read``) and decide (``approve``), tenant-scoped."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from dispatcher.api.bodies import json_response, model_response, parse_body
from dispatcher.api.deps import Approver, AppSettings, Reader, Registry, Sessions
from dispatcher.api.params import ApprovalIdPath
from dispatcher.control import approvals
from dispatcher.schemas import DecisionRequest
from dispatcher.states import ApprovalStatus

router = APIRouter()


@router.get("/v1/approvals")
async def list_approvals(
    caller: Reader,
    sessions: Sessions,
    status: Annotated[ApprovalStatus | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    async with sessions() as session:
        found = await approvals.list_approvals(
            session, tenant=caller.tenant, status=status, limit=limit
        )
    body = [a.model_dump(by_alias=True, mode="json") for a in found]
    return json_response(json.dumps({"approvals": body}))


@router.post("/v1/approvals/{approval_id}/decision")
async def decide(
    approval_id: ApprovalIdPath,
    request: Request,
    caller: Approver,
    sessions: Sessions,
    settings: AppSettings,
    registry: Registry,
) -> Response:
    body = parse_body(DecisionRequest, await request.body(), "decision")
    async with sessions() as session, session.begin():
        view = await approvals.decide(
            session,
            approval_id,
            body,
            actor=caller.actor(),
            scopes=caller.scopes,
            tenant=caller.tenant,
            registry=registry,
            topics=settings.topics(),
        )
    return model_response(view)
