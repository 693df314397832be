"""The escalation queue over HTTP: list (``read``), acknowledge and resolve
(``operate``), tenant-scoped like every other route."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from dispatcher.api.bodies import model_response, parse_body
from dispatcher.api.deps import AppSettings, Operator, Reader, Sessions
from dispatcher.api.openapi import documented
from dispatcher.api.params import AfterCursor, EscalationIdPath
from dispatcher.control import escalations
from dispatcher.errors import EscalationAlreadyResolved, EscalationNotFound, TransitionConflict
from dispatcher.schemas import EscalationList, EscalationView, ResolveRequest
from dispatcher.states import EscalationStatus
from dispatcher.views import queues

router = APIRouter()


@router.get("/v1/escalations", **documented(answer=EscalationList))
async def list_escalations(
    caller: Reader,
    sessions: Sessions,
    status: Annotated[EscalationStatus | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: AfterCursor = None,
) -> Response:
    position = queues.parse_escalation_after(after) if after is not None else None
    async with sessions() as session:
        # One more than the page: its presence says a next page exists, without a count.
        found = await queues.list_escalations(
            session, tenant=caller.tenant, status=status, limit=limit + 1, after=position
        )
    page = found[:limit]
    following = queues.escalation_position(page[-1]).token() if len(found) > limit else None
    return model_response(EscalationList(escalations=page, next=following))


_ESCALATION = documented(
    EscalationNotFound, EscalationAlreadyResolved, TransitionConflict, answer=EscalationView
)


@router.post("/v1/escalations/{escalation_id}/acknowledge", **_ESCALATION)
async def acknowledge(
    escalation_id: EscalationIdPath, caller: Operator, sessions: Sessions, settings: AppSettings
) -> Response:
    async with sessions() as session, session.begin():
        view = await escalations.acknowledge(
            session,
            escalation_id,
            actor=caller.actor(),
            tenant=caller.tenant,
            topics=settings.topics(),
        )
    return model_response(view)


@router.post(
    "/v1/escalations/{escalation_id}/resolve",
    **documented(
        EscalationNotFound,
        EscalationAlreadyResolved,
        TransitionConflict,
        body=ResolveRequest,
        answer=EscalationView,
    ),
)
async def resolve(
    escalation_id: EscalationIdPath,
    request: Request,
    caller: Operator,
    sessions: Sessions,
    settings: AppSettings,
) -> Response:
    body = parse_body(ResolveRequest, await request.body(), "resolution")
    async with sessions() as session, session.begin():
        view = await escalations.resolve(
            session,
            escalation_id,
            finding=body.finding,
            reason=body.reason,
            actor=caller.actor(),
            tenant=caller.tenant,
            topics=settings.topics(),
        )
    return model_response(view)
