"""The one mapping of errors to problem+json (``dispatcher.api.problems``), served by a
real uvicorn: an internal error is logged and answered as a plain 500, and the body
limit answers its 413 through the same mapping, and a database error answers 503 only
when trying again may help."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.types import ASGIApp

from devtools.embedded import free_port
from dispatcher.api import problems
from dispatcher.api.middleware import BodyLimit
from dispatcher.api.server import wait_started
from dispatcher.errors import IllegalTransition

LIMIT = 64


def app_raising(exc: Exception) -> ASGIApp:
    app = FastAPI()
    problems.install(app)

    @app.post("/fail")
    async def fail() -> None:
        raise exc

    return BodyLimit(app, LIMIT)


def app_running(engine: AsyncEngine, statements: list[str]) -> ASGIApp:
    app = FastAPI()
    problems.install(app)

    @app.post("/query")
    async def query() -> None:
        async with engine.connect() as conn:
            for statement in statements:
                await conn.execute(text(statement))

    return app


@contextlib.asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[httpx.AsyncClient]:
    port = free_port()
    config = uvicorn.Config(app, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    task = asyncio.create_task(server.serve())
    try:
        await wait_started(server, task)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            yield http
    finally:
        server.should_exit = True
        await task


async def test_an_illegal_transition_is_a_logged_500_not_a_409(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bug = IllegalTransition("confirmed", "authorized")
    with caplog.at_level(logging.ERROR, logger=problems.__name__):
        async with serving(app_raising(bug)) as http:
            response = await http.post("/fail")

    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json() == {
        "type": "urn:tool-dispatcher:problem:internal_error",
        "title": "Internal error",
        "status": 500,
        "code": "internal_error",
        "detail": "an unexpected error occurred",
    }
    [logged] = [r for r in caplog.records if r.name == problems.__name__]
    assert logged.exc_info is not None and logged.exc_info[1] is bug


async def test_the_body_limit_answers_through_the_mapping() -> None:
    async with serving(app_raising(RuntimeError("never reached"))) as http:
        response = await http.post("/fail", content=b"x" * (LIMIT + 1))

    assert response.status_code == 413
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json() == {
        "type": "urn:tool-dispatcher:problem:payload_too_large",
        "title": "Request body too large",
        "status": 413,
        "code": "payload_too_large",
        "detail": f"the body is larger than {LIMIT} bytes",
        "maxBytes": LIMIT,
    }


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("statements", "status"),
    [
        # The statement's data is at fault: sending it again fails again.
        pytest.param(["SELECT 1/0"], 400, id="data-error"),
        pytest.param(["SELECT array_fill(1, ARRAY[1000000000])"], 400, id="program-limit"),
        pytest.param(["SELECT * FROM nowhere"], 500, id="undefined-table"),
        pytest.param(
            ["SET statement_timeout = '10ms'", "SELECT pg_sleep(1)"], 503, id="statement-timeout"
        ),
    ],
)
async def test_database_errors_answer_503_only_when_retrying_may_help(
    engine: AsyncEngine, statements: list[str], status: int
) -> None:
    async with serving(app_running(engine, statements)) as http:
        response = await http.post("/query")

    assert response.status_code == status
    assert (
        response.json()["code"]
        == {
            400: "validation_failed",
            500: "internal_error",
            503: "service_unavailable",
        }[status]
    )
