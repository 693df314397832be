"""Every /v1 route names its scope as a dependency: without a key it answers 401, and
with a key lacking the scope 403, before reading a body or touching a row."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.api.app import create_app
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.settings import ApiKey, Settings, hash_api_key, load_settings
from tests.fixtures.api import running_api

pytestmark = pytest.mark.postgres

NO_SCOPES_KEY = "tdk_test_no_scopes"
# The scope each route needs; a route missing here (or a new one) fails the test.
SCOPES = {
    ("POST", "/v1/tool-calls"): "submit",
    ("GET", "/v1/tool-calls/{tool_call_id}"): "read",
    ("POST", "/v1/tool-calls/{tool_call_id}/retry"): "operate",
    ("GET", "/v1/runs"): "read",
    ("GET", "/v1/runs/{run_id}"): "read",
    ("GET", "/v1/runs/{run_id}/events"): "read",
    ("POST", "/v1/runs/{run_id}/stop"): "operate",
    ("GET", "/v1/approvals"): "read",
    ("POST", "/v1/approvals/{approval_id}/decision"): "approve",
    ("GET", "/v1/escalations"): "read",
    ("POST", "/v1/escalations/{escalation_id}/acknowledge"): "operate",
    ("POST", "/v1/escalations/{escalation_id}/resolve"): "operate",
    ("GET", "/v1/outbox/dead-letters"): "operate",
    ("POST", "/v1/outbox/dead-letters/{row_id}/retry"): "operate",
    ("POST", "/v1/outbox/dead-letters/{row_id}/discard"): "operate",
    ("GET", "/v1/capabilities"): "read",
    # Every tenant's pause needs "admin" too, checked once the body says so.
    ("POST", "/v1/capabilities/{capability_id}/pause"): "operate",
    ("POST", "/v1/capabilities/{capability_id}/resume"): "operate",
    # Another tenant's calls, or every tenant's, need "admin" too (the filter says so).
    ("POST", "/v1/operations"): "operate",
    ("GET", "/v1/operations/{operation_id}"): "operate",
    ("GET", "/v1/operations/{operation_id}/calls"): "operate",
    ("POST", "/v1/operations/{operation_id}/cancel"): "operate",
}


def v1_routes(settings: Settings, registry: CapabilityRegistry) -> set[tuple[str, str]]:
    app: Any = create_app(settings, registry)
    while not hasattr(app, "openapi"):  # unwrap the pure-ASGI middleware
        app = app.app
    return {
        (method.upper(), path)
        for path, operations in app.openapi()["paths"].items()
        if path.startswith("/v1/")
        for method in operations
    }


@pytest.fixture
async def base_url(
    database_url: str, registry: CapabilityRegistry, engine: AsyncEngine
) -> AsyncIterator[str]:
    settings = load_settings(
        {
            "database_url": database_url,
            "api_keys": [ApiKey(sha256=hash_api_key(NO_SCOPES_KEY), tenant="t", scopes=[])],
        }
    )
    assert v1_routes(settings, registry) == set(SCOPES)
    async with running_api(settings, registry, engine) as url:
        yield url


@pytest.mark.parametrize(("method", "path"), sorted(SCOPES))
async def test_every_route_checks_its_scope_first(base_url: str, method: str, path: str) -> None:
    url = re.sub(r"\{\w+\}", "some-id", path)
    async with httpx.AsyncClient(base_url=base_url) as http:
        anonymous = await http.request(method, url, content=b"not json")
        scopeless = await http.request(
            method, url, content=b"not json", headers={"Authorization": f"Bearer {NO_SCOPES_KEY}"}
        )
    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.json()["code"] == "unauthenticated"
    assert scopeless.status_code == 403, scopeless.text
    assert scopeless.json() | {"scope": SCOPES[method, path]} == scopeless.json()
