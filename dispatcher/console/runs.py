"""Runs: find one by id or browse the recent ones; a run's view (busy, the approval
banner, each call with both statuses, the event timeline); stopping it, after a
confirmation step that asks why."""

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
from dispatcher.control import runs
from dispatcher.errors import ValidationFailed
from dispatcher.schemas import StopRequest
from dispatcher.views import run_list
from dispatcher.views.run_view import load_run_view, run_events

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

# A long run's timeline is shown a page at a time, oldest first.
EVENTS_PER_PAGE = 200


# The runs list's filter: every run, the busy ones, the others.
FILTERS = {"all": None, "busy": True, "idle": False}


@router.get("/console/runs")
async def recent(request: Request, viewer: Signed) -> Response:
    query = dict(request.query_params)
    wanted = query.get("run", "").strip()
    if wanted:
        return redirect(link("runs", identifier(wanted, "run")))
    shown = query.get("show") or "all"
    if shown not in FILTERS:
        raise ValidationFailed(f"show must be one of {', '.join(FILTERS)}", field="show")
    after = paging.token(query)
    position = run_list.parse_run_after(after) if after else None
    async with sessions_of(request)() as session:
        fetched = await run_list.list_runs(
            session,
            viewer.principal.tenant,
            busy=FILTERS[shown],
            limit=paging.PAGE_SIZE + 1,
            after=position,
        )
    page = paging.Page.keyset(
        fetched,
        path="/console/runs",
        query=query,
        after=after,
        key=lambda r: run_list.run_position(r).token(),
    )
    return render(request, "runs.html", page=page, shown=shown, filters=FILTERS)


@router.get("/console/runs/{run_id}")
async def run(request: Request, run_id: str, viewer: Signed) -> Response:
    identifier(run_id, "runId")
    after = request.query_params.get("after")
    tenant = viewer.principal.tenant
    async with sessions_of(request)() as session:
        view = await load_run_view(session, tenant, run_id)
        events = await run_events(
            session,
            tenant,
            run_id,
            after=None if after is None else identifier(after, "after"),
            limit=EVENTS_PER_PAGE + 1,
        )
    more = events[EVENTS_PER_PAGE - 1].event_id if len(events) > EVENTS_PER_PAGE else None
    return render(request, "run.html", run=view, events=events[:EVENTS_PER_PAGE], more_after=more)


@router.get("/console/runs/{run_id}/stop")
async def confirm_stop(request: Request, run_id: str, viewer: Signed) -> Response:
    identifier(run_id, "runId")
    viewer.principal.require("operate")
    async with sessions_of(request)() as session:
        view = await load_run_view(session, viewer.principal.tenant, run_id)
    return render(request, "stop.html", run=view)


@router.post("/console/runs/{run_id}/stop")
async def stop(request: Request, run_id: str, viewer: Signed) -> Response:
    fields = await checked_form(request, viewer, "operate")
    identifier(run_id, "runId")
    try:
        body = StopRequest.model_validate({"reason": fields.get("reason", "").strip()})
    except ValueError as exc:
        raise ValidationFailed(f"the reason is not valid: {exc}", field="reason") from exc
    if not body.reason:
        raise ValidationFailed("say why the run is stopped", field="reason")
    registry: CapabilityRegistry = request.app.state.registry
    async with sessions_of(request)() as session, session.begin():
        await runs.stop_run(
            session,
            tenant=viewer.principal.tenant,
            run_id=run_id,
            actor=viewer.principal.actor("console"),
            reason=body.reason,
            registry=registry,
            topics=settings_of(request).topics(),
        )
    return redirect(link("runs", run_id), done="stopped")
