"""The tenant's dead letters over HTTP (scope ``operate``): list them a keyset page at
a time, retry one or discard one. The CLI's ``tool-dispatcher outbox`` commands act for
the whole installation; these, like the console's outbox page, for the key's tenant
only: another tenant's dead letter is not found."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from dispatcher.api.bodies import model_response, parse_body
from dispatcher.api.deps import Operator, Sessions
from dispatcher.api.openapi import documented
from dispatcher.control import outbox as control
from dispatcher.errors import DeadLetterNotFound
from dispatcher.schemas import (
    KEY_MAX_LENGTH,
    DeadLetterList,
    DeadLetterOutcome,
    DeadLetterView,
    DiscardRequest,
)
from dispatcher.views import outbox as views

router = APIRouter()

MAX_PAGE = 200
_MAX_ROW_ID = 2**63 - 1  # the id column is a bigint
# PostgreSQL text cannot hold a NUL: a filter with one could match no row, and the
# driver would refuse to send it (a 500); refused as a bad parameter instead.
_NO_NUL = r"^[^\x00]+$"

RowIdPath = Annotated[int, Path(ge=1, le=_MAX_ROW_ID, description="the dead letter's id")]
Filter = Annotated[str | None, Query(max_length=KEY_MAX_LENGTH, pattern=_NO_NUL)]


@router.get("/v1/outbox/dead-letters", **documented(answer=DeadLetterList))
async def list_dead_letters(
    caller: Operator,
    sessions: Sessions,
    topic: Filter = None,
    key: Filter = None,
    after: Annotated[
        int, Query(ge=0, le=_MAX_ROW_ID, description="the `next` of the page before")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> Response:
    where = views.DeadLetterFilter(topic=topic or "", key=key or "")
    async with sessions() as session:
        # One more than the page: its presence says a next page exists, without a count.
        found = await views.dead_letters(
            session, caller.tenant, where=where, limit=limit + 1, after=after
        )
    page = [DeadLetterView.model_validate(d, from_attributes=True) for d in found[:limit]]
    following = page[-1].id if len(found) > limit else None
    return model_response(DeadLetterList(dead_letters=page, next=following))


_ACTED = documented(DeadLetterNotFound, answer=DeadLetterOutcome)


@router.post("/v1/outbox/dead-letters/{row_id}/retry", **_ACTED)
async def retry(row_id: RowIdPath, caller: Operator, sessions: Sessions) -> Response:
    async with sessions() as session, session.begin():
        await control.retry_dead_letter(session, row_id, tenant=caller.tenant, actor=caller.actor())
    return model_response(DeadLetterOutcome(id=row_id, action="retried"))


@router.post(
    "/v1/outbox/dead-letters/{row_id}/discard",
    **documented(DeadLetterNotFound, body=DiscardRequest, answer=DeadLetterOutcome),
)
async def discard(
    row_id: RowIdPath, request: Request, caller: Operator, sessions: Sessions
) -> Response:
    # Checked before the row is looked at: an unconfirmed discard changes nothing.
    parse_body(DiscardRequest, await request.body(), "discard")
    async with sessions() as session, session.begin():
        await control.discard_dead_letter(
            session, row_id, tenant=caller.tenant, actor=caller.actor()
        )
    return model_response(DeadLetterOutcome(id=row_id, action="discarded"))
