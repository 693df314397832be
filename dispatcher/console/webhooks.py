"""The webhooks page: the tenant's dead webhook deliveries (their attempts ran out),
and sending one again once its receiver is fixed."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from dispatcher.console import paging
from dispatcher.console.web import ConsoleRoute, Signed, checked_form, redirect, render, sessions_of
from dispatcher.errors import ValidationFailed, WebhookDeliveryNotFound
from dispatcher.webhooks import deliveries, views

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

PATH = "/console/webhooks"


@router.get(PATH)
async def dead(request: Request, viewer: Signed) -> Response:
    query = dict(request.query_params)
    after = paging.cursor(query)
    async with sessions_of(request)() as session:
        fetched = await views.dead_deliveries(
            session, viewer.principal.tenant, after=after, limit=paging.PAGE_SIZE + 1
        )
    page = paging.Page.keyset(fetched, path=PATH, query=query, after=after, key=lambda x: x.seq)
    return render(request, "webhooks.html", page=page)


@router.post(PATH + "/{delivery_id}/redeliver")
async def redeliver(request: Request, delivery_id: str, viewer: Signed) -> Response:
    await checked_form(request, viewer, "operate")
    if not (delivery_id.isascii() and delivery_id.startswith("msg_") and len(delivery_id) <= 64):
        raise ValidationFailed("not a webhook delivery's id", field="deliveryId")
    async with sessions_of(request)() as session, session.begin():
        # Another tenant's delivery is not found either: the UPDATE names the tenant.
        if not await deliveries.redeliver(
            session,
            tenant=viewer.principal.tenant,
            delivery_id=delivery_id,
            by=viewer.principal.identity,
        ):
            raise WebhookDeliveryNotFound(delivery_id)
    return redirect(PATH, done="redelivered")
