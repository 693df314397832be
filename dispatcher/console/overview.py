"""The overview: one tile per figure an on-call engineer checks first (the calls in
flight by status, the oldest unknown outcome, the queues, the outbox), recomputed on
every read and reloaded by the page itself every few seconds."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from dispatcher.console.web import ConsoleRoute, Signed, render, sessions_of
from dispatcher.views import overview

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

REFRESH_SECONDS = 5


@router.get("/console/overview")
async def show(request: Request, viewer: Signed) -> Response:
    async with sessions_of(request)() as session:
        figures = await overview.load_overview(session, viewer.principal.tenant)
    return render(request, "overview.html", figures=figures, refresh=REFRESH_SECONDS)
