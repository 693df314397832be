"""The outbox page: the tenant's dead letters (rows the broker refused for good) with
what waits behind each, and retrying or discarding one."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from dispatcher.console import paging
from dispatcher.console.web import (
    ConsoleRoute,
    Signed,
    checked_form,
    redirect,
    render,
    sessions_of,
)
from dispatcher.control import outbox as control
from dispatcher.errors import ValidationFailed
from dispatcher.views import outbox as views

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

_MAX_ROW_ID = 2**63 - 1  # the id column is a bigint
_MAX_FILTER = 255


@router.get("/console/outbox")
async def dead_letters(request: Request, viewer: Signed) -> Response:
    query = dict(request.query_params)
    shown = views.DeadLetterFilter(topic=_filter(query, "topic"), key=_filter(query, "key"))
    after = paging.cursor(query)
    async with sessions_of(request)() as session:
        fetched = await views.dead_letters(
            session,
            viewer.principal.tenant,
            where=shown,
            limit=paging.PAGE_SIZE + 1,
            after=after,
        )
    page = paging.Page.keyset(
        fetched, path="/console/outbox", query=query, after=after, key=lambda d: d.id
    )
    return render(request, "outbox.html", page=page, shown=shown)


@router.post("/console/outbox/{row_id}/retry")
async def retry(request: Request, row_id: str, viewer: Signed) -> Response:
    await checked_form(request, viewer, "operate")
    async with sessions_of(request)() as session, session.begin():
        await control.retry_dead_letter(
            session,
            _row_id(row_id),
            tenant=viewer.principal.tenant,
            actor=viewer.principal.actor("console"),
        )
    return redirect("/console/outbox", done="retried")


@router.post("/console/outbox/{row_id}/discard")
async def discard(request: Request, row_id: str, viewer: Signed) -> Response:
    fields = await checked_form(request, viewer, "operate")
    found = _row_id(row_id)
    # Discarding loses the message for good: the form's box must be ticked (the
    # browser asks for it too, but a form without it is refused here, unchanged).
    if fields.get("confirm") != "yes":
        raise ValidationFailed("tick the box to confirm the discard", field="confirm")
    async with sessions_of(request)() as session, session.begin():
        await control.discard_dead_letter(
            session,
            found,
            tenant=viewer.principal.tenant,
            actor=viewer.principal.actor("console"),
        )
    return redirect("/console/outbox", done="discarded")


def _row_id(value: str) -> int:
    # ASCII digits only ("²" is a digit to str.isdigit, not to int), and few of them.
    if not (value.isascii() and value.isdigit() and len(value) <= 19):
        raise ValidationFailed("the row id is not a dead letter's id", field="rowId")
    if not 1 <= int(value) <= _MAX_ROW_ID:
        raise ValidationFailed("the row id is not a dead letter's id", field="rowId")
    return int(value)


def _filter(query: dict[str, str], name: str) -> str:
    value = query.get(name, "").strip()
    if len(value) > _MAX_FILTER:
        raise ValidationFailed(f"{name} is longer than {_MAX_FILTER} characters", field=name)
    return value
