"""Capabilities over HTTP: the registry as the caller's tenant sees it (``read``), and
pausing or resuming one (``operate`` for the caller's tenant, ``admin`` for every
tenant)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from dispatcher.api.auth import Principal
from dispatcher.api.bodies import model_response, parse_body
from dispatcher.api.deps import AppSettings, Operator, Reader, Registry, Sessions
from dispatcher.api.openapi import documented
from dispatcher.api.params import CapabilityIdPath
from dispatcher.capability_views import CapabilityChange, CapabilityList, PauseRequest
from dispatcher.control import pauses
from dispatcher.errors import CapabilityNotFound
from dispatcher.states import CapabilityStatus

router = APIRouter()


@router.get("/v1/capabilities", **documented(answer=CapabilityList))
async def list_capabilities(caller: Reader, sessions: Sessions, registry: Registry) -> Response:
    """Every registered capability: paused or active for the caller's tenant, and how
    many of its calls wait in ``authorized``."""
    async with sessions() as session:
        found = await pauses.list_capabilities(session, registry, tenant=caller.tenant)
    return model_response(found)


@router.post(
    "/v1/capabilities/{capability_id}/pause",
    **documented(CapabilityNotFound, body=PauseRequest, answer=CapabilityChange),
)
async def pause(
    capability_id: CapabilityIdPath,
    request: Request,
    caller: Operator,
    sessions: Sessions,
    settings: AppSettings,
    registry: Registry,
) -> Response:
    """Hold the capability's calls in ``authorized`` (not sent, no attempt spent) until
    it is resumed; pausing a paused capability changes nothing."""
    return await _change(capability_id, request, caller, sessions, settings, registry, True)


@router.post(
    "/v1/capabilities/{capability_id}/resume",
    **documented(CapabilityNotFound, body=PauseRequest, answer=CapabilityChange),
)
async def resume(
    capability_id: CapabilityIdPath,
    request: Request,
    caller: Operator,
    sessions: Sessions,
    settings: AppSettings,
    registry: Registry,
) -> Response:
    """Send the capability's calls again; those that waited go at once, with their keys."""
    return await _change(capability_id, request, caller, sessions, settings, registry, False)


async def _change(
    capability_id: str,
    request: Request,
    caller: Principal,
    sessions: Sessions,
    settings: AppSettings,
    registry: Registry,
    pausing: bool,
) -> Response:
    body = parse_body(PauseRequest, await request.body(), "pause request")
    if body.every_tenant:
        caller.require("admin")
    target = CapabilityStatus.PAUSED if pausing else CapabilityStatus.ACTIVE
    async with sessions() as session, session.begin():
        change = await pauses.change_capability(
            session,
            capability_id,
            body,
            target,
            tenant=caller.tenant,
            actor=caller.actor(),
            registry=registry,
            topics=settings.topics(),
        )
    await pauses.after_change(sessions, change, target)
    return model_response(change)
