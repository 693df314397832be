"""With the database out of reach every route answers 503 ``service_unavailable``, as
intake does, so clients retry instead of treating the outage as a bug; a genuine
database bug still answers 500."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.settings import ApiKey, Settings, hash_api_key, load_settings
from dispatcher.testing.embedded import free_port
from tests.fixtures.api import bearer, running_api

OPERATOR_KEY = "tdk_test_acme_every_scope"
OPERATOR = bearer(OPERATOR_KEY)

ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/v1/approvals", None),
    ("POST", "/v1/approvals/apr-1/decision", {"decision": "approve", "reason": "ok"}),
    ("POST", "/v1/runs/run-1/stop", {"reason": "chaos"}),
    ("GET", "/v1/runs/run-1", None),
    ("GET", "/v1/tool-calls/tc-1", None),
    ("POST", "/v1/tool-calls/tc-1/retry", {"reason": "chaos"}),
    ("GET", "/v1/runs/run-1/events", None),
    ("GET", "/v1/escalations", None),
    ("POST", "/v1/escalations/esc-1/acknowledge", None),
    (
        "POST",
        "/v1/tool-calls",
        {
            "runId": "run-1",
            "turnId": "turn-1",
            "capabilityId": "refund-order-v2",
            "input": {"orderId": "o-1", "amountCents": 500},
            "correlationId": "corr-1",
        },
    ),
]


def settings_for(database_url: str) -> Settings:
    keys = [ApiKey(sha256=hash_api_key(OPERATOR_KEY), tenant="acme")]
    return load_settings({"database_url": database_url, "api_keys": keys})


@pytest.fixture
async def unreachable_api(registry: CapabilityRegistry) -> AsyncIterator[httpx.AsyncClient]:
    # A port nothing listens on: every connection attempt is refused at once.
    refused = f"postgresql://postgres@127.0.0.1:{free_port('127.0.0.1')}/tool_dispatcher"
    async with (
        running_api(settings_for(refused), registry) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=OPERATOR) as http,
    ):
        yield http


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
async def test_routes_answer_503_when_the_database_refuses_connections(
    unreachable_api: httpx.AsyncClient, method: str, path: str, body: dict[str, Any] | None
) -> None:
    response = await unreachable_api.request(method, path, json=body)

    assert response.status_code == 503, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["code"] == "service_unavailable"
    assert problem["status"] == 503
    assert problem["type"] == "urn:tool-dispatcher:problem:service_unavailable"
    # Intake's 503 carries no Retry-After; the other routes match it.
    assert "retry-after" not in response.headers
    # The driver's message names hosts and ports: it stays in the log.
    assert "127.0.0.1" not in response.text


@pytest.mark.postgres
async def test_a_database_bug_still_answers_500(
    empty_database_url: str, registry: CapabilityRegistry
) -> None:
    # Reachable but unmigrated: the query fails with UndefinedTable (a ProgrammingError),
    # which retrying cannot fix.
    async with (
        running_api(settings_for(empty_database_url), registry) as base_url,
        httpx.AsyncClient(base_url=base_url, headers=OPERATOR) as http,
    ):
        response = await http.get("/v1/tool-calls/tc-1")

    assert response.status_code == 500, response.text
    assert response.json()["code"] == "internal_error"
