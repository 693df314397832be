"""Every error leaves the API as RFC 9457 ``application/problem+json`` with a stable
``code``; this module is the one place that does the mapping."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa
from starlette.exceptions import HTTPException

from dispatcher.db.errors import DbErrorClass, classify
from dispatcher.errors import (
    DispatcherError,
    InternalError,
    LimitExceeded,
    ServiceUnavailable,
    ValidationFailed,
)
from dispatcher.metrics import INTAKE_SUBMISSIONS

log = logging.getLogger(__name__)
PROBLEM_JSON = "application/problem+json"

_HTTP_CODES = {
    404: ("not_found", "Not found"),
    405: ("method_not_allowed", "Method not allowed"),
    415: ("unsupported_media_type", "Unsupported media type"),
}


def _problem(status: int, code: str, title: str, detail: str, **extra: Any) -> JSONResponse:
    body = {
        "type": f"urn:tool-dispatcher:problem:{code}",
        "title": title,
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON)


def answer(exc: DispatcherError) -> JSONResponse:
    """The problem+json answer to ``exc``. An internal error's detail names the
    program's own states: it goes to the log (the caller's job), the client learns only
    that the service failed."""
    if isinstance(exc, InternalError):
        return _internal()
    response = _problem(exc.status, exc.code, exc.title, exc.detail, **exc.extra)
    if isinstance(exc, LimitExceeded) and exc.retry_after is not None:
        response.headers["Retry-After"] = str(exc.retry_after)
    return response


def _internal() -> JSONResponse:
    return _problem(
        InternalError.status,
        InternalError.code,
        InternalError.title,
        "an unexpected error occurred",
    )


# What answers 503 (safe to retry): what a later try may cure, and program limits,
# which have always answered 503 like every OperationalError (whether they are the
# client's fault, a 400, is not decided here yet). Data errors and bugs answer 500.
_UNAVAILABLE = frozenset(
    {
        DbErrorClass.UNAVAILABLE,
        DbErrorClass.CONTENTION,
        DbErrorClass.TRANSIENT,
        DbErrorClass.PROGRAM_LIMIT,
    }
)


def install(app: FastAPI) -> None:
    @app.exception_handler(DispatcherError)
    async def dispatcher_error(request: Request, exc: DispatcherError) -> JSONResponse:
        if request.url.path == "/v1/tool-calls" and request.method == "POST":
            INTAKE_SUBMISSIONS.labels(exc.code).inc()
        if isinstance(exc, InternalError):
            log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return answer(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {
                "loc": [str(p) for p in err.get("loc", ())],
                "msg": err.get("msg", ""),
                "type": err.get("type", ""),
            }
            for err in exc.errors()
        ]
        return answer(
            ValidationFailed("the request body or parameters are not valid", errors=errors)
        )

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code, title = _HTTP_CODES.get(exc.status_code, ("http_error", "HTTP error"))
        return _problem(exc.status_code, code, title, str(exc.detail))

    async def database_error(request: Request, exc: Exception) -> JSONResponse:
        if classify(exc) not in _UNAVAILABLE:
            raise exc  # a bug: on to ``unexpected`` and its 500
        # The answer intake gives (dispatcher.intake.batcher), so a client has one rule:
        # 503 service_unavailable is safe to retry. A warning without a traceback: an
        # outage fails every request alike. The driver's message, which names hosts and
        # ports, stays in the log.
        log.warning(
            "database unavailable on %s %s: %s",
            request.method,
            request.url.path,
            (str(exc).splitlines() or [exc.__class__.__name__])[0],
        )
        return answer(ServiceUnavailable("the database is not reachable; try again"))

    # Registered apart from ``unexpected``: Starlette re-raises whatever reaches the
    # catch-all handler after answering, and the server then logs it as a crash.
    for cls in (sa.DBAPIError, sa.DisconnectionError, sa.TimeoutError, OSError):
        app.add_exception_handler(cls, database_error)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _internal()
