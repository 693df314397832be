"""Tool calls over HTTP: submit (``submit``), read with an optional long-poll
(``read``), and an operator's retry (``operate``)."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.api.bodies import json_response, model_response, parse_body
from dispatcher.api.deps import (
    AppLimits,
    AppSettings,
    Operator,
    Reader,
    Registry,
    Sessions,
    caller_of,
    checks_its_caller,
)
from dispatcher.api.limits import Limits
from dispatcher.api.openapi import documented
from dispatcher.api.params import ToolCallIdPath
from dispatcher.control import retry as control
from dispatcher.errors import (
    CapabilityNotFound,
    IdempotencyKeyReused,
    RateLimited,
    RetryNotAllowed,
    RunStopped,
    ToolCallIdConflict,
    ToolCallNotFound,
    TransitionConflict,
)
from dispatcher.intake.approvals import approval_ref
from dispatcher.intake.batcher import IntakeBatcher
from dispatcher.metrics import INTAKE_SUBMISSIONS
from dispatcher.schemas import RetryRequest, SubmitRequest, ToolCallView
from dispatcher.states import SETTLED_STATES
from dispatcher.tracing import annotate, submitted_in
from dispatcher.views.queries import tool_call_row

# A long-poll holds a request, not a connection to the database; the cap keeps it
# below the idle timeouts of common proxies.
MAX_WAIT_SECONDS = 20.0

SessionFactory = async_sessionmaker[AsyncSession]

router = APIRouter()


_CREATED = {"Location": {"description": "the call's URL", "schema": {"type": "string"}}}


@router.post(
    "/v1/tool-calls",
    **checks_its_caller(
        documented(
            CapabilityNotFound,
            ToolCallIdConflict,
            RunStopped,
            IdempotencyKeyReused,
            RateLimited,
            body=SubmitRequest,
            answer=ToolCallView,
            status=201,
            also={
                201: {"description": "recorded", "headers": _CREATED},
                200: {
                    "description": "an earlier submission with this key, replayed",
                    "model": ToolCallView,
                    "headers": _CREATED,
                },
            },
        )
    ),
)
async def submit_tool_call(request: Request) -> Response:
    caller = caller_of(request, "submit")
    # The app's parts straight from its state, not as dependencies: this is the hot
    # route, and FastAPI's solving of each dependency cost more than the lookup.
    state = request.app.state
    limits: Limits = state.limits
    batcher: IntakeBatcher = state.batcher
    # Before the body is parsed or anything is written: a flood costs a dict lookup.
    limits.submissions.take(caller.tenant)
    body = parse_body(SubmitRequest, await request.body(), "tool call")
    trace = submitted_in(request.headers)
    submission = await batcher.submit(body, caller.tenant, caller.identity, trace)
    INTAKE_SUBMISSIONS.labels("created" if submission.created else "replayed").inc()
    view: ToolCallView = submission.view
    annotate(view, body.tool_name)
    return json_response(
        view.model_dump_json(by_alias=True),
        status=201 if submission.created else 200,
        # Ids keep the identifier contract, but "?", "#" and "%" are legal in them and
        # mean something else in a URL: the segment is always encoded.
        headers={"Location": f"/v1/tool-calls/{quote(view.tool_call_id, safe='')}"},
    )


@router.get(
    "/v1/tool-calls/{tool_call_id}",
    **documented(ToolCallNotFound, RateLimited, answer=ToolCallView),
)
async def get_tool_call(
    tool_call_id: ToolCallIdPath,
    request: Request,
    caller: Reader,
    sessions: Sessions,
    limits: AppLimits,
    wait_seconds: Annotated[
        float,
        Query(
            alias="waitSeconds",
            ge=0,
            le=MAX_WAIT_SECONDS,
            description="hold the answer until the call is settled, at most this long",
        ),
    ] = 0,
) -> Response:
    if wait_seconds <= 0:
        return model_response(await _view(sessions, caller.tenant, tool_call_id))
    # A held long-poll costs a task and a socket: a cap per tenant keeps one tenant's
    # waiters from crowding out the others. Beyond it 429 with Retry-After rather than
    # the current view at once, which a waiting client would answer by polling again
    # immediately, in a tight loop, just when the service is under most load.
    limits.long_polls.acquire(caller.tenant)
    try:
        return await _long_poll(request, sessions, caller.tenant, tool_call_id, wait_seconds)
    finally:
        limits.long_polls.release(caller.tenant)


async def _view(sessions: SessionFactory, tenant: str, tool_call_id: str) -> ToolCallView:
    async with sessions() as session:
        row = await tool_call_row(session, tenant, tool_call_id)
        if row is None:
            raise ToolCallNotFound(tool_call_id)
        return ToolCallView.of(row, await approval_ref(session, tenant, tool_call_id))


async def _long_poll(
    request: Request, sessions: SessionFactory, tenant: str, tool_call_id: str, wait_seconds: float
) -> Response:
    deadline = time.monotonic() + wait_seconds
    pause = 0.02
    while True:
        view = await _view(sessions, tenant, tool_call_id)
        left = deadline - time.monotonic()
        # A client that went away gives its slot back now, not when its wait ends.
        if view.status in SETTLED_STATES or left <= 0 or await request.is_disconnected():
            return model_response(view)
        # A cheap indexed read per pause, with no connection held while waiting;
        # the pause grows so a long wait costs a few dozen reads, not thousands.
        await asyncio.sleep(min(pause, left))
        pause = min(pause * 2, 0.5)


@router.post(
    "/v1/tool-calls/{tool_call_id}/retry",
    **documented(
        ToolCallNotFound,
        RetryNotAllowed,
        RunStopped,
        TransitionConflict,
        body=RetryRequest,
        answer=ToolCallView,
    ),
)
async def retry(
    tool_call_id: ToolCallIdPath,
    request: Request,
    caller: Operator,
    sessions: Sessions,
    settings: AppSettings,
    registry: Registry,
) -> Response:
    body = parse_body(RetryRequest, await request.body(), "retry request")
    async with sessions() as session, session.begin():
        view = await control.retry_call(
            session,
            tool_call_id,
            body,
            tenant=caller.tenant,
            actor=caller.actor(),
            registry=registry,
            topics=settings.topics(),
        )
    return model_response(view)
