"""The home page: the escalation queue (honest unknowns waiting for a human), one
escalation with its evidence, and acknowledging and resolving it."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

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
from dispatcher.control import escalations
from dispatcher.errors import EscalationNotFound, ValidationFailed
from dispatcher.schemas import Finding, ResolveRequest
from dispatcher.states import EscalationStatus
from dispatcher.views import queries, queues

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

E = EscalationStatus
# The filters of the queue, by their value in the URL.
FILTERS: dict[str, tuple[EscalationStatus, ...]] = {
    "unresolved": (E.OPEN, E.ACKNOWLEDGED),
    "open": (E.OPEN,),
    "acknowledged": (E.ACKNOWLEDGED,),
    "resolved": (E.RESOLVED,),
    "all": tuple(E),
}
# The reconciler's dossier (reconciler/rulings.py), titled for a human; any other key
# (the caller's own evidence) is shown under its own name.
EVIDENCE_TITLES = {
    "lastAnswer": "The provider's last answer",
    "providerLookup": "Lookups tried",
    "compensation": "Compensation",
    "policy": "Reconcile policy",
    "lastError": "Last error",
    "commands": "Resolving from the command line",
}
FINDINGS = {
    Finding.CONFIRMED_SUCCESS: "confirmed: the effect happened",
    Finding.CONFIRMED_FAILURE: "no effect: it did not happen",
    Finding.COMPENSATED: "compensated: it happened and was undone",
}


@router.get("/console/")
async def queue(request: Request, viewer: Signed) -> Response:
    query = dict(request.query_params)
    shown = query.get("status") or "unresolved"
    if shown not in FILTERS:
        raise ValidationFailed(f"status must be one of {', '.join(FILTERS)}", field="status")
    after = paging.token(query)
    position = queues.parse_escalation_after(after) if after else None
    async with sessions_of(request)() as session:
        fetched = await queues.list_escalations(
            session,
            tenant=viewer.principal.tenant,
            status=FILTERS[shown],
            limit=paging.PAGE_SIZE + 1,
            after=position,
        )
    page = paging.Page.keyset(
        fetched,
        path="/console/",
        query=query,
        after=after,
        key=lambda e: queues.escalation_position(e).token(),
    )
    return render(request, "escalations.html", page=page, shown=shown, filters=list(FILTERS))


@router.get("/console/escalations/{escalation_id}")
async def escalation(request: Request, escalation_id: str, viewer: Signed) -> Response:
    identifier(escalation_id, "escalationId")
    tenant = viewer.principal.tenant
    async with sessions_of(request)() as session:
        found = await queries.escalation(session, tenant, escalation_id)
        if found is None:
            raise EscalationNotFound(escalation_id)
        call = await queries.tool_call_row(session, tenant, found.tool_call_id)
        events = await queries.call_events(session, tenant, found.tool_call_id)
    evidence = {k: v for k, v in found.evidence.items() if k not in ("call", "history")}
    return render(
        request,
        "escalation.html",
        escalation=found,
        call=call,
        events=events,
        evidence=evidence,
        titles=EVIDENCE_TITLES,
        findings=FINDINGS,
    )


@router.post("/console/escalations/{escalation_id}/acknowledge")
async def acknowledge(request: Request, escalation_id: str, viewer: Signed) -> Response:
    await checked_form(request, viewer, "operate")
    identifier(escalation_id, "escalationId")
    async with sessions_of(request)() as session, session.begin():
        await escalations.acknowledge(
            session,
            escalation_id,
            actor=viewer.principal.actor("console"),
            tenant=viewer.principal.tenant,
            topics=settings_of(request).topics(),
        )
    return redirect(link("escalations", escalation_id), done="acknowledged")


@router.post("/console/escalations/{escalation_id}/resolve")
async def resolve(request: Request, escalation_id: str, viewer: Signed) -> Response:
    fields = await checked_form(request, viewer, "operate")
    identifier(escalation_id, "escalationId")
    body = _resolution(fields)
    async with sessions_of(request)() as session, session.begin():
        await escalations.resolve(
            session,
            escalation_id,
            finding=body.finding,
            reason=body.reason,
            actor=viewer.principal.actor("console"),
            tenant=viewer.principal.tenant,
            topics=settings_of(request).topics(),
        )
    return redirect(link("escalations", escalation_id), done="resolved")


def _resolution(fields: dict[str, str]) -> ResolveRequest:
    if not fields.get("reason", "").strip():
        raise ValidationFailed("a note saying how you know is required", field="reason")
    try:
        return ResolveRequest.model_validate(
            {"finding": fields.get("finding", ""), "reason": fields["reason"].strip()}
        )
    except ValueError as exc:
        raise ValidationFailed(f"the resolution is not valid: {exc}", field="finding") from exc
