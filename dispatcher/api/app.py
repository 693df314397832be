"""The FastAPI application: the lifespan that owns the engine and the intake batcher,
and the routes of every concern (one module each: tool calls, runs, approvals,
escalations, health)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.types import ASGIApp

from dispatcher.api import problems
from dispatcher.api.approvals import add_approval_routes
from dispatcher.api.auth import ApiKeyAuth
from dispatcher.api.escalations import add_escalation_routes
from dispatcher.api.health import add_health_routes
from dispatcher.api.middleware import BodyLimit, RequestTiming
from dispatcher.api.runs import add_run_routes
from dispatcher.api.tool_calls import add_tool_call_routes
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.engine import create_engine, session_factory
from dispatcher.intake.batcher import IntakeBatcher
from dispatcher.settings import Settings


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
    add_tool_call_routes(app, auth, lambda: state["sessions"], lambda: state["batcher"])
    add_health_routes(app, lambda: state["engine"])

    return RequestTiming(BodyLimit(app, settings.max_body_bytes))
