"""The FastAPI application: intake, reads of calls, runs and run event logs,
approvals, control commands, escalations, health and metrics."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.types import ASGIApp

from dispatcher.api import problems
from dispatcher.api.approvals import add_approval_routes
from dispatcher.api.auth import ApiKeyAuth
from dispatcher.api.bodies import parse_body
from dispatcher.api.escalations import add_escalation_routes
from dispatcher.api.middleware import BodyLimit, RequestTiming
from dispatcher.api.runs import add_run_routes
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.engine import create_engine, session_factory
from dispatcher.db.tables import execution_events, tool_calls
from dispatcher.errors import ServiceUnavailable, ToolCallNotFound, ValidationFailed
from dispatcher.intake.batcher import IntakeBatcher
from dispatcher.metrics import INTAKE_SUBMISSIONS
from dispatcher.schemas import EventView, SubmitRequest, ToolCallView
from dispatcher.settings import Settings
from dispatcher.states import SETTLED_STATES

JSON = "application/json"
# A long-poll holds a request, not a connection to the database; the cap keeps it
# below the idle timeouts of common proxies.
MAX_WAIT_SECONDS = 20.0


def _json(model_dump: str, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(model_dump, status_code=status, media_type=JSON, headers=headers)


def create_app(
    settings: Settings, registry: CapabilityRegistry, engine: AsyncEngine | None = None
) -> ASGIApp:
    """Build the API. With no ``engine`` it creates (and disposes) its own."""
    auth = ApiKeyAuth(settings.api_keys)
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        eng = engine or create_engine(settings)
        sessions = session_factory(eng)
        batcher = IntakeBatcher(
            sessions,
            registry,
            dispatch_topic=settings.dispatch_topic,
            events_topic=settings.events_topic,
            max_batch=settings.intake_batch_max,
        )
        batcher.start()
        state.update(engine=eng, sessions=sessions, batcher=batcher)
        try:
            yield
        finally:
            await batcher.stop()
            if engine is None:
                await eng.dispose()

    app = FastAPI(title="tool-dispatcher", version="0.1.0", lifespan=lifespan)
    problems.install(app)
    add_escalation_routes(app, auth, lambda: state["sessions"], settings)
    add_approval_routes(app, auth, lambda: state["sessions"], settings, registry)
    add_run_routes(app, auth, lambda: state["sessions"], settings, registry)

    @app.post("/v1/tool-calls", status_code=201)
    async def submit_tool_call(request: Request) -> Response:
        principal = auth.authenticate(request)
        principal.require("submit")
        body = parse_body(SubmitRequest, await request.body(), "tool call")
        submission = await state["batcher"].submit(body, principal.tenant, principal.identity)
        INTAKE_SUBMISSIONS.labels("created" if submission.created else "replayed").inc()
        view: ToolCallView = submission.view
        return _json(
            view.model_dump_json(by_alias=True),
            status=201 if submission.created else 200,
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
            async with state["sessions"]() as session:
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
                return _json(ToolCallView.of(row._mapping).model_dump_json(by_alias=True))
            # A cheap indexed read per pause, with no connection held while waiting;
            # the pause grows so a long wait costs a few dozen reads, not thousands.
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, 0.5)

    @app.get("/v1/runs/{run_id}/events")
    async def run_events(
        run_id: str,
        request: Request,
        after: Annotated[str | None, Query(description="return events after this eventId")] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> Response:
        principal = auth.authenticate(request)
        principal.require("read")
        query = select(execution_events).where(
            execution_events.c.tenant == principal.tenant, execution_events.c.run_id == run_id
        )
        async with state["sessions"]() as session:
            if after is not None:
                cursor = (
                    await session.execute(
                        select(execution_events.c.seq).where(
                            execution_events.c.event_id == after,
                            execution_events.c.tenant == principal.tenant,
                            execution_events.c.run_id == run_id,
                        )
                    )
                ).scalar_one_or_none()
                if cursor is None:
                    raise ValidationFailed(f"no event {after!r} in this run", after=after)
                query = query.where(execution_events.c.seq > cursor)
            rows = (
                await session.execute(query.order_by(execution_events.c.seq).limit(limit))
            ).all()
        events = [EventView.of(r._mapping).model_dump(by_alias=True, mode="json") for r in rows]
        return _json(json.dumps({"runId": run_id, "events": events}))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        try:
            async with state["engine"].connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception as exc:  # any failure means "not ready"
            raise ServiceUnavailable("the database is not reachable") from exc
        return {"status": "ready"}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return RequestTiming(BodyLimit(app, settings.max_body_bytes))
