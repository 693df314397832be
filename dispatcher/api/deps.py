"""What routes depend on: the caller, checked for a scope, and the app's parts.

Every route names the scope it needs in its signature (``Annotated[Principal,
Depends(require("read"))]``), so authentication happens before a body is read and the
scope of each route is visible where the route is declared.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

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


def require(scope: Scope) -> Callable[[Request, Bearer], Awaitable[Principal]]:
    """A dependency: the caller's API key, which must carry ``scope``."""

    # A coroutine, like the app's other parts: it never blocks (a dict lookup of the
    # key's digest), and a plain function would cost a thread hand-off per request.
    async def principal(request: Request, _declared: Bearer) -> Principal:
        auth: ApiKeyAuth = request.app.state.auth
        caller = auth.authenticate(request)
        caller.require(scope)
        return caller

    return principal


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


Submitter = Annotated[Principal, Depends(require("submit"))]
Reader = Annotated[Principal, Depends(require("read"))]
Approver = Annotated[Principal, Depends(require("approve"))]
Operator = Annotated[Principal, Depends(require("operate"))]
Sessions = Annotated[async_sessionmaker[AsyncSession], Depends(_sessions)]
AppSettings = Annotated[Settings, Depends(_settings)]
Registry = Annotated[CapabilityRegistry, Depends(_registry)]
AppLimits = Annotated[Limits, Depends(_limits)]
