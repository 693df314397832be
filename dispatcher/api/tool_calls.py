"""Tool calls over HTTP: submit (``submit``) and read, or long-poll until settled
(``read``), tenant-scoped."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import FastAPI, Query, Request, Response
from sqlalchemy import select

from dispatcher.api.approvals import Sessions
from dispatcher.api.auth import ApiKeyAuth
from dispatcher.api.bodies import parse_body
from dispatcher.db.tables import tool_calls
from dispatcher.errors import ToolCallNotFound
from dispatcher.intake.batcher import IntakeBatcher
from dispatcher.metrics import INTAKE_SUBMISSIONS
from dispatcher.schemas import SubmitRequest, ToolCallView
from dispatcher.states import SETTLED_STATES

JSON = "application/json"
# A long-poll holds a request, not a connection to the database; the cap keeps it
# below the idle timeouts of common proxies.
MAX_WAIT_SECONDS = 20.0


def add_tool_call_routes(
    app: FastAPI, auth: ApiKeyAuth, sessions: Sessions, batcher: Callable[[], IntakeBatcher]
) -> None:
    """Add ``POST /v1/tool-calls`` and ``GET /v1/tool-calls/{toolCallId}``; ``sessions``
    and ``batcher`` return the app's own (they exist only once the lifespan started)."""

    @app.post("/v1/tool-calls", status_code=201)
    async def submit_tool_call(request: Request) -> Response:
        principal = auth.authenticate(request)
        principal.require("submit")
        body = parse_body(SubmitRequest, await request.body(), "tool call")
        submission = await batcher().submit(body, principal.tenant, principal.identity)
        INTAKE_SUBMISSIONS.labels("created" if submission.created else "replayed").inc()
        view: ToolCallView = submission.view
        return Response(
            view.model_dump_json(by_alias=True),
            status_code=201 if submission.created else 200,
            media_type=JSON,
            headers={"Location": f"/v1/tool-calls/{view.tool_call_id}"},
        )

    @app.get("/v1/tool-calls/{tool_call_id}")
    async def get_tool_call(
        tool_call_id: str,
        request: Request,
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
        principal = auth.authenticate(request)
        principal.require("read")
        deadline = time.monotonic() + wait_seconds
        pause = 0.02
        while True:
            async with sessions()() as session:
                row = (
                    await session.execute(
                        select(tool_calls).where(
                            tool_calls.c.tool_call_id == tool_call_id,
                            tool_calls.c.tenant == principal.tenant,
                        )
                    )
                ).first()
            if row is None:
                # Another tenant's call is reported exactly like a missing one.
                raise ToolCallNotFound(tool_call_id)
            left = deadline - time.monotonic()
            if row.status in SETTLED_STATES or left <= 0:
                return Response(
                    ToolCallView.of(row._mapping).model_dump_json(by_alias=True),
                    media_type=JSON,
                )
            # A cheap indexed read per pause, with no connection held while waiting;
            # the pause grows so a long wait costs a few dozen reads, not thousands.
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, 0.5)
