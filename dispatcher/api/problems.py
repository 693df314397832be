"""Every error leaves the API as RFC 9457 ``application/problem+json`` with a stable
``code``; this module is the one place that does the mapping."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic.alias_generators import to_camel
from sqlalchemy import exc as sa
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from dispatcher.db.errors import REFUSED_INPUT, DbErrorClass, classify, refusal, sqlstate
from dispatcher.errors import (
    DispatcherError,
    InternalError,
    LimitExceeded,
    ServiceUnavailable,
    ValidationFailed,
    problem_body,
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
    body = problem_body(status, code, title, detail, **extra)
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


# What answers 503 (safe to retry): what a later try may cure. What the request's own
# data caused (a value a type rejects, a server limit such as the btree row size)
# answers 400: sending it again fails again. Constraint violations and bugs answer 500.
_UNAVAILABLE = frozenset(
    {
        DbErrorClass.UNAVAILABLE,
        DbErrorClass.CONTENTION,
        DbErrorClass.TRANSIENT,
    }
)


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _methods_of(app: FastAPI, request: Request) -> list[str]:
    """Every method some route of the app serves on the request's path. Asked of the
    routes themselves (``matches``), so routers included in the app answer too."""
    return [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL
            for route in app.router.routes
        )
    ]


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
        # A path or query parameter is named as the client spells it ("toolCallId"),
        # not by the handler's argument.
        loc = errors[0]["loc"] if errors else []
        field = to_camel(loc[-1]) if loc else ""
        where = {"path": "path parameter", "query": "query parameter"}.get(loc[0] if loc else "")
        detail = f"the {where} {field} is not valid" if where else "the request is not valid"
        return answer(ValidationFailed(detail, field=field, errors=errors))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code, title = _HTTP_CODES.get(exc.status_code, ("http_error", "HTTP error"))
        response = _problem(exc.status_code, code, title, str(exc.detail))
        if exc.status_code == 405:
            # Starlette's own Allow names the methods of the first route of the path
            # only; a path served by several routes (GET and POST /v1/tool-calls) has
            # the methods of them all.
            response.headers["Allow"] = ", ".join(_methods_of(app, request))
        return response

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
        # No one is left to read an answer; it is there for the request metrics, as
        # 499 "client closed request" (nginx's convention), not as a failure of ours.
        log.info("client closed %s %s before sending its body", request.method, request.url.path)
        return _problem(
            499, "client_closed_request", "Client closed request", "the body did not arrive"
        )

    async def database_error(request: Request, exc: Exception) -> JSONResponse:
        kind = classify(exc)
        if kind in REFUSED_INPUT:
            # The answer intake gives a submission the database refused.
            log.info("database refused %s %s: %s", request.method, request.url.path, refusal(exc))
            return answer(
                ValidationFailed(
                    f"the database refused the request: {refusal(exc)}", sqlstate=sqlstate(exc)
                )
            )
        if kind not in _UNAVAILABLE:
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
