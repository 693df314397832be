"""Bulk operations over HTTP (scope ``operate``; another tenant's calls, or every
tenant's, also ``admin``): submit one (or a dry run: its count and a sample), read its
progress, page through the calls it touched, cancel it. A worker does the work
(:mod:`dispatcher.operations.processor`); these routes only record and read."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import AfterValidator

from dispatcher.api.bodies import model_response, parse_body
from dispatcher.api.deps import Operator, Sessions
from dispatcher.api.openapi import documented
from dispatcher.api.params import AfterCursor
from dispatcher.errors import IdempotencyKeyReused, OperationFinished, OperationNotFound
from dispatcher.operations import service
from dispatcher.operations.models import (
    OperationAnswer,
    OperationRequest,
    OperationView,
    TouchedCalls,
)
from dispatcher.schemas import ID_MAX_LENGTH, check_identifier, id_schema

router = APIRouter()

OperationIdPath = Annotated[
    str, AfterValidator(check_identifier), Path(json_schema_extra=id_schema(ID_MAX_LENGTH))
]
MAX_PAGE = 500


@router.post(
    "/v1/operations",
    **documented(
        IdempotencyKeyReused,
        body=OperationRequest,
        answer=OperationView,
        status=201,
        also={
            200: {
                "description": "a dry run's count and sample, or the operation a key made",
                "model": OperationAnswer,
            }
        },
    ),
)
async def submit(
    request: Request,
    caller: Operator,
    sessions: Sessions,
    dry_run: Annotated[bool, Query(alias="dryRun")] = False,
) -> Response:
    """Record an operation over every call its filter selects (a worker then works it
    through), or with ``dryRun`` (in the body or the query) only count them."""
    body = parse_body(OperationRequest, await request.body(), "operation")
    if dry_run:
        body = body.model_copy(update={"dry_run": True})
    tenant, admin = caller.tenant, caller.may("admin")
    if body.dry_run:
        async with sessions() as session:
            dry = await service.dry_run(session, body, tenant=tenant, admin=admin)
        return model_response(dry)
    async with sessions() as session, session.begin():
        view, created = await service.submit(
            session, body, tenant=tenant, admin=admin, actor=caller.actor()
        )
    return model_response(view, 201 if created else 200)


def _scope(caller: Operator) -> str | None:
    # An admin reads and cancels every tenant's operations; others their tenant's.
    return None if caller.may("admin") else caller.tenant


@router.get("/v1/operations/{operation_id}", **documented(OperationNotFound, answer=OperationView))
async def show(operation_id: OperationIdPath, caller: Operator, sessions: Sessions) -> Response:
    async with sessions() as session:
        view = await service.show(session, operation_id, tenant=_scope(caller))
    return model_response(view)


@router.get(
    "/v1/operations/{operation_id}/calls", **documented(OperationNotFound, answer=TouchedCalls)
)
async def touched(
    operation_id: OperationIdPath,
    caller: Operator,
    sessions: Sessions,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    after: AfterCursor = None,
) -> Response:
    """The calls the operation touched, with each one's outcome, a page at a time."""
    async with sessions() as session:
        page = await service.touched(
            session, operation_id, tenant=_scope(caller), limit=limit, after=after
        )
    return model_response(page)


@router.post(
    "/v1/operations/{operation_id}/cancel",
    **documented(OperationNotFound, OperationFinished, answer=OperationView),
)
async def cancel(operation_id: OperationIdPath, caller: Operator, sessions: Sessions) -> Response:
    """Stop the operation after the batch in flight; what it touched stays touched."""
    async with sessions() as session, session.begin():
        view = await service.cancel(
            session, operation_id, tenant=_scope(caller), actor=caller.actor()
        )
    return model_response(view)
