"""One tool call: both statuses and the path between them, what was sent and what came
back, its approval and escalations, and an operator's retry."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from dispatcher.console.formats import link
from dispatcher.console.web import (
    ConsoleRoute,
    Signed,
    checked_form,
    identifier,
    redirect,
    render,
    sessions_of,
    settings_of,
)
from dispatcher.control import retry as control
from dispatcher.control.retry import RETRIABLE
from dispatcher.errors import ToolCallNotFound, ValidationFailed
from dispatcher.intake.approvals import approval_ref
from dispatcher.schemas import RetryRequest
from dispatcher.states import ExecutionStatus
from dispatcher.views import queries
from dispatcher.views.run_view import status_path

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


@router.get("/console/calls/{tool_call_id}")
async def call(request: Request, tool_call_id: str, viewer: Signed) -> Response:
    identifier(tool_call_id, "toolCallId")
    tenant = viewer.principal.tenant
    async with sessions_of(request)() as session:
        row = await queries.tool_call_row(session, tenant, tool_call_id)
        if row is None:
            raise ToolCallNotFound(tool_call_id)
        approval = await approval_ref(session, tenant, tool_call_id)
        events = await queries.call_events(session, tenant, tool_call_id)
        episodes = await queries.call_escalations(session, tenant, tool_call_id)
    return render(
        request,
        "call.html",
        call=row,
        approval=approval,
        events=events,
        path_of_statuses=status_path(events),
        via=next(
            (e.payload.get("via") for e in events if e.event_type == "tool.call.requested"), None
        ),
        escalations=episodes,
        retriable=ExecutionStatus(row["status"]) in RETRIABLE,
    )


@router.post("/console/calls/{tool_call_id}/retry")
async def retry(request: Request, tool_call_id: str, viewer: Signed) -> Response:
    fields = await checked_form(request, viewer, "operate")
    identifier(tool_call_id, "toolCallId")
    try:
        body = RetryRequest.model_validate(
            {
                "reason": fields.get("reason", "").strip(),
                "newIdempotencyKey": fields.get("new_idempotency_key") == "on",
            }
        )
    except ValueError as exc:
        raise ValidationFailed(f"the retry is not valid: {exc}", field="reason") from exc
    async with sessions_of(request)() as session, session.begin():
        await control.retry_call(
            session,
            tool_call_id,
            body,
            tenant=viewer.principal.tenant,
            actor=viewer.principal.actor("console"),
            registry=request.app.state.registry,
            topics=settings_of(request).topics(),
        )
    return redirect(link("calls", tool_call_id), done="retried")
