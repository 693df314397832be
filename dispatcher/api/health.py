"""Probes and metrics: ``/healthz`` (the process answers), ``/readyz`` (the database
answers too) and ``/metrics`` (Prometheus). No authentication: orchestrators and
scrapers call them."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.api.openapi import documented
from dispatcher.errors import InternalError, ServiceUnavailable

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", **documented(ServiceUnavailable, InternalError, v1=False))
async def readyz(request: Request) -> dict[str, str]:
    engine: AsyncEngine = request.app.state.engine
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception as exc:  # any failure means "not ready"
        raise ServiceUnavailable("the database is not reachable") from exc
    return {"status": "ready"}


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
