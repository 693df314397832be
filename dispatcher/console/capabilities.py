"""The capabilities page: the registry as the operator's tenant sees it, paused or
active, with the calls each holds waiting, and pausing or resuming one (for the tenant,
or for every tenant with the ``admin`` scope)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.capability_views import PauseRequest
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
from dispatcher.control import pauses
from dispatcher.errors import ValidationFailed
from dispatcher.states import CapabilityStatus

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


def _registry(request: Request) -> CapabilityRegistry:
    registry: CapabilityRegistry = request.app.state.registry
    return registry


@router.get("/console/capabilities")
async def capabilities(request: Request, viewer: Signed) -> Response:
    async with sessions_of(request)() as session:
        found = await pauses.list_capabilities(
            session, _registry(request), tenant=viewer.principal.tenant
        )
    return render(request, "capabilities.html", capabilities=found.capabilities)


@router.post("/console/capabilities/{capability_id}/{verb}")
async def change(request: Request, capability_id: str, verb: str, viewer: Signed) -> Response:
    fields = await checked_form(request, viewer, "operate")
    if verb not in ("pause", "resume"):
        raise ValidationFailed("the action is pause or resume", field="verb")
    every_tenant = fields.get("everyTenant") == "yes"
    if every_tenant:
        viewer.principal.require("admin")
    reason = fields.get("reason", "").strip()
    if not reason:
        raise ValidationFailed("say why: the reason is recorded with the pause", field="reason")
    body = PauseRequest(reason=reason, every_tenant=every_tenant)
    target = CapabilityStatus.PAUSED if verb == "pause" else CapabilityStatus.ACTIVE
    async with sessions_of(request)() as session, session.begin():
        done = await pauses.change_capability(
            session,
            identifier(capability_id, "capabilityId"),
            body,
            target,
            tenant=viewer.principal.tenant,
            actor=viewer.principal.actor("console"),
            registry=_registry(request),
            topics=settings_of(request).topics(),
        )
    await pauses.after_change(sessions_of(request), done, target)
    said = ("paused" if verb == "pause" else "resumed") if done.changed else "unchanged"
    return redirect("/console/capabilities", done=said)
