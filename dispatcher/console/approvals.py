"""The approval inbox: pending approvals with exactly what a decision binds to (the
input, its hash, the policy version and risk), and approving or rejecting one."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.console import paging
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
from dispatcher.control import approvals
from dispatcher.errors import ApprovalNotFound, CapabilityNotFound, ValidationFailed
from dispatcher.schemas import ApprovalView, DecisionRequest
from dispatcher.states import ApprovalStatus
from dispatcher.views import queries, queues

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

# "all" plus each status, by its value in the URL.
FILTERS = ["pending", *(s.value for s in ApprovalStatus if s is not ApprovalStatus.PENDING), "all"]


@router.get("/console/approvals")
async def inbox(request: Request, viewer: Signed) -> Response:
    query = dict(request.query_params)
    shown = query.get("status") or "pending"
    if shown not in FILTERS:
        raise ValidationFailed(f"status must be one of {', '.join(FILTERS)}", field="status")
    after = paging.token(query)
    position = queues.parse_approval_after(after) if after else None
    async with sessions_of(request)() as session:
        fetched = await queues.list_approvals(
            session,
            tenant=viewer.principal.tenant,
            status=None if shown == "all" else ApprovalStatus(shown),
            limit=paging.PAGE_SIZE + 1,
            after=position,
        )
    page = paging.Page.keyset(
        fetched,
        path="/console/approvals",
        query=query,
        after=after,
        key=lambda a: queues.approval_position(a).token(),
    )
    return render(request, "approvals.html", page=page, shown=shown, filters=FILTERS)


@router.get("/console/approvals/{approval_id}")
async def approval(request: Request, approval_id: str, viewer: Signed) -> Response:
    identifier(approval_id, "approvalId")
    tenant = viewer.principal.tenant
    async with sessions_of(request)() as session:
        found = await queries.approval(session, tenant, approval_id)
        if found is None:
            raise ApprovalNotFound(approval_id)
        call = await queries.tool_call_row(session, tenant, found.tool_call_id)
    return render(
        request,
        "approval.html",
        approval=found,
        call=call,
        mine=_self_approval(request, found, viewer.principal.identity),
    )


def _self_approval(request: Request, approval: ApprovalView, who: str) -> bool:
    """Whether the decision would be refused as self-approval: the same rule as the
    control function's, so the page offers exactly what the API would accept."""
    registry: CapabilityRegistry = request.app.state.registry
    try:
        forbidden = registry.get(approval.capability_id).forbid_self_approval
    except CapabilityNotFound:
        return False
    return forbidden and approval.requested_by == who


@router.post("/console/approvals/{approval_id}/decision")
async def decide(request: Request, approval_id: str, viewer: Signed) -> Response:
    fields = await checked_form(request, viewer, "approve")
    identifier(approval_id, "approvalId")
    try:
        body = DecisionRequest.model_validate(
            {"decision": fields.get("decision", ""), "reason": fields.get("reason", "").strip()}
        )
    except ValueError as exc:
        raise ValidationFailed(f"the decision is not valid: {exc}", field="decision") from exc
    registry: CapabilityRegistry = request.app.state.registry
    async with sessions_of(request)() as session, session.begin():
        await approvals.decide(
            session,
            approval_id,
            body,
            actor=viewer.principal.actor("console"),
            scopes=viewer.principal.scopes,
            tenant=viewer.principal.tenant,
            registry=registry,
            topics=settings_of(request).topics(),
        )
    done = "approved" if body.decision == "approve" else "rejected"
    return redirect(link("approvals", approval_id), done=done)
