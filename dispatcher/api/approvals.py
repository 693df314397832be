"""Approvals over HTTP: list (``read``) and decide (``approve``), tenant-scoped."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from dispatcher.api.bodies import model_response, parse_body
from dispatcher.api.deps import Approver, AppSettings, Reader, Registry, Sessions
from dispatcher.api.openapi import documented
from dispatcher.api.params import AfterCursor, ApprovalIdPath
from dispatcher.control import approvals
from dispatcher.errors import (
    ApprovalAlreadyDecided,
    ApprovalExpired,
    ApprovalNotFound,
    ApprovalStale,
    CapabilityUnavailable,
    RunStopped,
    SelfApprovalForbidden,
    TransitionConflict,
)
from dispatcher.schemas import ApprovalList, ApprovalView, DecisionRequest
from dispatcher.states import ApprovalStatus
from dispatcher.views import queues

router = APIRouter()


@router.get("/v1/approvals", **documented(answer=ApprovalList))
async def list_approvals(
    caller: Reader,
    sessions: Sessions,
    status: Annotated[ApprovalStatus | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: AfterCursor = None,
) -> Response:
    position = queues.parse_approval_after(after) if after is not None else None
    async with sessions() as session:
        # One more than the page: its presence says a next page exists, without a count.
        found = await queues.list_approvals(
            session, tenant=caller.tenant, status=status, limit=limit + 1, after=position
        )
    page = found[:limit]
    following = queues.approval_position(page[-1]).token() if len(found) > limit else None
    return model_response(ApprovalList(approvals=page, next=following))


@router.post(
    "/v1/approvals/{approval_id}/decision",
    **documented(
        SelfApprovalForbidden,
        ApprovalNotFound,
        ApprovalAlreadyDecided,
        ApprovalExpired,
        ApprovalStale,
        CapabilityUnavailable,
        RunStopped,
        TransitionConflict,
        body=DecisionRequest,
        answer=ApprovalView,
    ),
)
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
