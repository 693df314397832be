"""Liveness, readiness and Prometheus metrics, unauthenticated."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.errors import ServiceUnavailable


def add_health_routes(app: FastAPI, engine: Callable[[], AsyncEngine]) -> None:
    """Add ``/healthz``, ``/readyz`` (the database answers) and ``/metrics``."""

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        try:
            async with engine().connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception as exc:  # any failure means "not ready"
            raise ServiceUnavailable("the database is not reachable") from exc
        return {"status": "ready"}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
