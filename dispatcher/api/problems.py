"""Every error leaves the API as RFC 9457 ``application/problem+json`` with a stable
``code``; this module is the one place that does the mapping."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from dispatcher.errors import DispatcherError
from dispatcher.metrics import INTAKE_SUBMISSIONS

log = logging.getLogger(__name__)
PROBLEM_JSON = "application/problem+json"

_HTTP_CODES = {
    404: ("not_found", "Not found"),
    405: ("method_not_allowed", "Method not allowed"),
    415: ("unsupported_media_type", "Unsupported media type"),
}


def problem(status: int, code: str, title: str, detail: str, **extra: Any) -> JSONResponse:
    body = {
        "type": f"urn:tool-dispatcher:problem:{code}",
        "title": title,
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON)


def install(app: FastAPI) -> None:
    @app.exception_handler(DispatcherError)
    async def dispatcher_error(request: Request, exc: DispatcherError) -> JSONResponse:
        if request.url.path == "/v1/tool-calls" and request.method == "POST":
            INTAKE_SUBMISSIONS.labels(exc.code).inc()
        return problem(exc.status, exc.code, exc.title, exc.detail, **exc.extra)

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
        return problem(
            400,
            "validation_failed",
            "The request is not valid",
            "the request body or parameters are not valid",
            errors=errors,
        )

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code, title = _HTTP_CODES.get(exc.status_code, ("http_error", "HTTP error"))
        return problem(exc.status_code, code, title, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(500, "internal_error", "Internal error", "an unexpected error occurred")
