"""The FastAPI application: one router per resource (tool calls, runs, approvals,
escalations, the outbox's dead letters, health), problem+json for every error, and the
pure-ASGI middleware."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.types import ASGIApp

from dispatcher import console
from dispatcher.api import (
    approvals,
    capabilities,
    escalations,
    health,
    openapi,
    operations,
    outbox,
    problems,
    runs,
    tool_calls,
)
from dispatcher.api.auth import ApiKeyAuth
from dispatcher.api.limits import Limits
from dispatcher.api.middleware import BodyLimit, RequestTiming
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.engine import create_engine, session_factory
from dispatcher.intake.batcher import IntakeBatcher
from dispatcher.settings import Settings
from kit import telemetry


def create_app(
    settings: Settings, registry: CapabilityRegistry, engine: AsyncEngine | None = None
) -> ASGIApp:
    """Build the API. With no ``engine`` it creates (and disposes) its own."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        eng = engine or create_engine(settings)
        sessions = session_factory(eng)
        batcher = IntakeBatcher(
            eng,
            registry,
            topics=settings.topics(),
            max_batch=settings.intake_batch_max,
        )
        batcher.start()
        app.state.engine, app.state.sessions, app.state.batcher = eng, sessions, batcher
        try:
            yield
        finally:
            await batcher.stop()
            if engine is None:
                await eng.dispose()

    app = FastAPI(title="tool-dispatcher", version="0.1.0", lifespan=lifespan)
    app.state.settings, app.state.registry = settings, registry
    app.state.auth = ApiKeyAuth(settings.api_keys)
    app.state.limits = Limits.of(settings)
    problems.install(app)
    openapi.install(app)
    for resource in (
        tool_calls, runs, approvals, escalations, outbox, capabilities, operations, health
    ):  # fmt: skip
        app.include_router(resource.router)
    console.install(app, settings, app.state.auth.keyring)
    if telemetry.enabled():
        _instrument(app)
    return RequestTiming(
        BodyLimit(app, settings.max_body_bytes, settings.http_body_timeout_seconds)
    )


def _instrument(app: FastAPI) -> None:
    """A SERVER span per request, continuing a producer's ``traceparent``: the official
    instrumentation (its ASGI middleware extracts the context and names the span by
    route). The ops routes are left out (probes every few seconds), and so are its
    per-message receive/send spans (two more spans per request that say nothing)."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app, excluded_urls="/healthz,/readyz,/metrics", exclude_spans=["receive", "send"]
    )
