"""The bulk operations pages: a filter, the count of the calls it selects (and the
first of them) before anything is confirmed, then the operation's page, whose progress
bar follows its record (the console's script polls a small JSON of it; without the
script the page reloads itself while the operation runs).

Everything goes through :mod:`dispatcher.operations.service`, as the API does: the same
checks of who may name which tenant's calls, the same records.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError

from dispatcher.console.web import (
    ConsoleRoute,
    Signed,
    Viewer,
    checked_form,
    identifier,
    redirect,
    render,
    secured,
    sessions_of,
)
from dispatcher.errors import ValidationFailed
from dispatcher.operations import service
from dispatcher.operations.actions import ACTIONS
from dispatcher.operations.models import (
    SOURCES,
    DryRunView,
    OperationKind,
    OperationRequest,
)

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

_FILTER_FIELDS = ("capabilityId", "tenant", "lastError", "since", "until", "runId")
_KINDS = [k for k in OperationKind if k in ACTIONS]


def request_of(fields: dict[str, str], *, dry_run: bool) -> OperationRequest:
    """The operation a form describes, validated as the API validates its body."""
    filter_: dict[str, Any] = {k: fields[k].strip() for k in _FILTER_FIELDS if fields.get(k)}
    if fields.get("status"):
        filter_["status"] = [fields["status"]]
    if fields.get("everyTenant") == "yes":
        filter_["everyTenant"] = True
    body = {
        "kind": fields.get("kind", ""),
        "reason": fields.get("reason", "").strip(),
        "filter": filter_,
        "newIdempotencyKey": fields.get("newIdempotencyKey") == "yes",
        "dryRun": dry_run,
    }
    if fields.get("finding"):
        body["finding"] = fields["finding"]
    try:
        return OperationRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValidationFailed(f"{where}: {first['msg']}" if where else first["msg"]) from None


def _statuses() -> list[str]:
    return sorted({s.value for kind in _KINDS for s in SOURCES[kind]})


@router.get("/console/operations")
async def form(request: Request, viewer: Signed) -> Response:
    """The filter; with ``preview=1``, the count and sample of what it selects now."""
    fields = dict(request.query_params)
    preview: DryRunView | None = None
    if fields.get("preview"):
        wanted = request_of(fields, dry_run=True)
        async with sessions_of(request)() as session:
            preview = await service.dry_run(session, wanted, **_who(viewer))
    return render(
        request,
        "operations.html",
        fields=fields,
        preview=preview,
        kinds=[k.value for k in _KINDS],
        statuses=_statuses(),
    )


def _who(viewer: Viewer) -> dict[str, Any]:
    return {"tenant": viewer.principal.tenant, "admin": viewer.may("admin")}


@router.post("/console/operations")
async def submit(request: Request, viewer: Signed) -> Response:
    fields = await checked_form(request, viewer, "operate")
    wanted = request_of(fields, dry_run=False)
    async with sessions_of(request)() as session, session.begin():
        made, _ = await service.submit(
            session, wanted, **_who(viewer), actor=viewer.principal.actor("console")
        )
    return redirect(f"/console/operations/{made.operation_id}", done="operation-started")


def _scope(viewer: Viewer) -> str | None:
    return None if viewer.may("admin") else viewer.principal.tenant


@router.get("/console/operations/{operation_id}")
async def page(request: Request, operation_id: str, viewer: Signed) -> Response:
    async with sessions_of(request)() as session:
        op = await service.show(
            session, identifier(operation_id, "operationId"), tenant=_scope(viewer)
        )
    return render(request, "operation.html", op=op)


@router.get("/console/operations/{operation_id}/progress")
async def progress(request: Request, operation_id: str, viewer: Signed) -> Response:
    """What the progress bar needs, small enough to poll twice a second."""
    async with sessions_of(request)() as session:
        op = await service.show(
            session, identifier(operation_id, "operationId"), tenant=_scope(viewer)
        )
    body = {
        "state": op.state.value,
        "total": op.total,
        "done": op.done,
        "failed": op.failed,
        "percent": op.percent,
    }
    return secured(Response(json.dumps(body), media_type="application/json"))


@router.post("/console/operations/{operation_id}/cancel")
async def cancel(request: Request, operation_id: str, viewer: Signed) -> Response:
    await checked_form(request, viewer, "operate")
    op_id = identifier(operation_id, "operationId")
    async with sessions_of(request)() as session, session.begin():
        await service.cancel(
            session, op_id, tenant=_scope(viewer), actor=viewer.principal.actor("console")
        )
    return redirect(f"/console/operations/{op_id}", done="cancelled")
