"""What routes depend on: the caller, checked for a scope, and the app's parts.

Every route names the scope it needs in its signature (``Annotated[Principal,
Depends(require("read"))]``), so authentication happens before a body is read and the
scope of each route is visible where the route is declared; the one exception, the
submit route, calls :func:`caller_of` as its first line (:func:`checks_its_caller`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.api.auth import ApiKeyAuth, Principal
from dispatcher.api.limits import Limits
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.settings import Scope, Settings

# Declares the bearer scheme on every route that names a scope, so the document
# cannot leave one out; it checks nothing (``auto_error=False``): ApiKeyAuth does.
_BEARER = HTTPBearer(
    scheme_name="apiKey", description="an API key: its tenant and scopes", auto_error=False
)
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]

# The app's parts are coroutines: FastAPI runs a plain function in the thread pool, a
# thread hand-off per dependency per request (measured: about a twelfth of the API
# process's samples at 16 clients); none of them blocks.


def caller_of(request: Request, scope: Scope) -> Principal:
    """The caller's API key, which must carry ``scope``."""
    auth: ApiKeyAuth = request.app.state.auth
    caller = auth.authenticate(request)
    caller.require(scope)
    return caller


def require(scope: Scope) -> Callable[[Request, Bearer], Awaitable[Principal]]:
    """A dependency: :func:`caller_of` for ``scope``."""

    # A coroutine, like the app's other parts: it never blocks (a dict lookup of the
    # key's digest), and a plain function would cost a thread hand-off per request.
    async def principal(request: Request, _declared: Bearer) -> Principal:
        return caller_of(request, scope)

    return principal


def checks_its_caller(route: dict[str, Any]) -> dict[str, Any]:
    """Route decorator arguments (:func:`dispatcher.api.openapi.documented`) for a route
    that calls :func:`caller_of` first thing in its body instead of naming a scope in
    its signature: its document declares the bearer scheme all the same. Only for the
    hot submit route, where solving the two dependencies cost 7% of the API's CPU
    per call at 16 clients (``python -m bench.intake``)."""
    extra = route.setdefault("openapi_extra", {})
    extra["security"] = [{_BEARER.scheme_name: []}]
    return route


async def _sessions(request: Request) -> async_sessionmaker[AsyncSession]:
    # Set by the lifespan: the factory exists only once the app has started.
    sessions: async_sessionmaker[AsyncSession] = request.app.state.sessions
    return sessions


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def _registry(request: Request) -> CapabilityRegistry:
    registry: CapabilityRegistry = request.app.state.registry
    return registry


async def _limits(request: Request) -> Limits:
    limits: Limits = request.app.state.limits
    return limits


Reader = Annotated[Principal, Depends(require("read"))]
Approver = Annotated[Principal, Depends(require("approve"))]
Operator = Annotated[Principal, Depends(require("operate"))]
Sessions = Annotated[async_sessionmaker[AsyncSession], Depends(_sessions)]
AppSettings = Annotated[Settings, Depends(_settings)]
Registry = Annotated[CapabilityRegistry, Depends(_registry)]
AppLimits = Annotated[Limits, Depends(_limits)]
