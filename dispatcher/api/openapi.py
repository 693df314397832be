"""What ``/openapi.json`` says about each route, declared once at the route.

Bodies are parsed by hand (:func:`dispatcher.api.bodies.parse_body`) to keep the
400 ``validation_failed`` answer, its error locations and "an empty body is ``{}``",
so FastAPI cannot see them: :func:`documented` declares each body from its pydantic
model in :mod:`dispatcher.schemas`, the 2xx answer's model, and one problem+json
response per status the route's errors (classes of :mod:`dispatcher.errors`) can
answer with. :func:`install` builds the document from those declarations: it adds the
body and problem schemas, and drops the 422 FastAPI adds by default (the service
answers a bad request with 400; its one 422 is ``idempotency_key_reused``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field

from dispatcher.api.problems import PROBLEM_JSON
from dispatcher.errors import (
    DispatcherError,
    Forbidden,
    InternalError,
    PayloadTooLarge,
    RequestTimeout,
    ServiceUnavailable,
    Unauthenticated,
    ValidationFailed,
)

JSON = "application/json"
_SCHEMAS = "#/components/schemas/"

# A path whose id the router cannot take (an encoded ``/``) reaches no route.
NOT_ROUTED = (404, "not_found", "Not found")
Extra = tuple[int, str, str]


class Problem(BaseModel):
    """An RFC 9457 problem, as every error leaves the API (:mod:`dispatcher.api.problems`):
    a stable ``code`` plus the members its error names (``errors``, ``toolCallId``...)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="urn:tool-dispatcher:problem:<code>")
    title: str
    status: int
    detail: str
    code: str = Field(description="stable: docs/api.md lists every code")


# Models named by routes' request bodies, by schema name: install() adds them to the
# document's components (FastAPI only collects the models of parameters it parses).
_BODIES: dict[str, type[BaseModel]] = {}

# Every /v1 route: a key (401) with its scope (403), a database (503), and bugs (500).
_EVERY_V1: tuple[type[DispatcherError], ...] = (
    ValidationFailed,
    Unauthenticated,
    Forbidden,
    ServiceUnavailable,
    InternalError,
)


def documented(
    *errors: type[DispatcherError] | Extra,
    answer: type[BaseModel] | None = None,
    status: int = 200,
    body: type[BaseModel] | None = None,
    body_required: bool = True,
    v1: bool = True,
    also: dict[int, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for a route decorator: ``answer`` is the model of the ``status``
    answer, ``body`` the model of the JSON body, ``errors`` what the route raises beyond
    what every /v1 route can answer (and 413 and 408 with a body); ``also`` more 2xx answers."""
    raised: list[type[DispatcherError] | Extra] = [*errors]
    if v1:
        raised[:0] = _EVERY_V1
    if body is not None:
        # A body can be too large, or too slow to arrive (the middleware answers both).
        raised.extend((PayloadTooLarge, RequestTimeout))
        _BODIES[body.__name__] = body
    kwargs: dict[str, Any] = {"status_code": status, "responses": {**(also or {})}}
    kwargs["responses"].update(problem_responses(raised))
    if answer is not None:
        kwargs["response_model"] = answer
    if body is not None:
        kwargs["openapi_extra"] = {
            "requestBody": {
                "required": body_required,
                "content": {JSON: {"schema": {"$ref": _SCHEMAS + body.__name__}}},
            }
        }
    return kwargs


def problem_responses(raised: Iterable[type[DispatcherError] | Extra]) -> dict[int, Any]:
    """One problem+json response per status, naming the codes it carries."""
    codes: dict[int, list[str]] = {}
    titles: dict[int, str] = {}
    for error in raised:
        status, code, title = error if isinstance(error, tuple) else _leaf(error)
        titles.setdefault(status, title)
        if code not in codes.setdefault(status, []):
            codes[status].append(code)
    return {
        status: {
            "description": f"{titles[status]} (code: {', '.join(codes[status])})",
            "content": {PROBLEM_JSON: {"schema": _problem_schema(status, codes[status])}},
        }
        for status, _ in sorted(codes.items())
    }


def _leaf(error: type[DispatcherError]) -> Extra:
    return error.status, error.code, error.title


def _problem_schema(status: int, codes: list[str]) -> dict[str, Any]:
    # ``code`` is not pinned to an enum: a branch's new leaf (a 400 for some other
    # cause) would make the document lie until someone lists it here. The status is.
    return {
        "allOf": [
            {"$ref": _SCHEMAS + "Problem"},
            {"properties": {"status": {"const": status}, "code": {"examples": codes}}},
        ]
    }


def install(app: FastAPI) -> None:
    """Serve the document built from the routes' declarations."""

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _build(app)
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]


def _build(app: FastAPI) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    models: list[type[BaseModel]] = [Problem, *_BODIES.values()]
    for model in models:
        schema = model.model_json_schema(ref_template=_SCHEMAS + "{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    # FastAPI adds a 422 of its own validation errors to each route with parameters;
    # this service answers those with 400 (dispatcher.api.problems).
    for operations in doc["paths"].values():
        for operation in operations.values():
            default = operation["responses"].get("422", {}).get("content", {}).get(JSON)
            if default == {"schema": {"$ref": _SCHEMAS + "HTTPValidationError"}}:
                del operation["responses"]["422"]
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    return doc
