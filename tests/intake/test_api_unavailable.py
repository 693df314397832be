"""With the database out of reach every route answers 503 ``service_unavailable``, as
intake does, so clients retry instead of treating the outage as a bug; a genuine
database bug still answers 500. A submission refused by the request, the key or the
registry alone keeps its 4xx during the outage: a producer that retries 503s must not
retry what can never succeed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from devtools.embedded import free_port
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.settings import ApiKey, Settings, hash_api_key, load_settings
from tests.fixtures.api import bearer, running_api
from tests.fixtures.capabilities import with_capability

OPERATOR_KEY = "tdk_test_acme_every_scope"
OPERATOR = bearer(OPERATOR_KEY)
READ_ONLY_KEY = "tdk_test_acme_read_only"

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
    keys = [
        ApiKey(sha256=hash_api_key(OPERATOR_KEY), tenant="acme"),
        ApiKey(sha256=hash_api_key(READ_ONLY_KEY), tenant="acme", scopes=["read"]),
    ]
    return load_settings({"database_url": database_url, "api_keys": keys})


@pytest.fixture
def registry(registry: CapabilityRegistry) -> CapabilityRegistry:
    """The sandbox registry and a disabled capability."""
    off = registry.get("send-email").model_copy(update={"id": "send-email-off", "enabled": False})
    return with_capability(registry, off)


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


EMAIL = {"runId": "run-1", "capabilityId": "send-email", "input": {"to": "a@b.c"}}
REFUND = {"runId": "run-1", "capabilityId": "refund-order-v2", "correlationId": "corr-1"}
# What needs only the request, the key and the registry: the same answer as with a
# database. Only the valid submission needs one.
WITHOUT_THE_DATABASE: dict[str, tuple[str, dict[str, Any], tuple[int, str]]] = {
    "unknown capability": (
        OPERATOR_KEY,
        {**EMAIL, "capabilityId": "no-such-capability"},
        (404, "capability_not_found"),
    ),
    "disabled capability": (
        OPERATOR_KEY,
        {**EMAIL, "capabilityId": "send-email-off"},
        (400, "validation_failed"),
    ),
    "template value missing": (
        OPERATOR_KEY,
        {**REFUND, "input": {"amountCents": 5}},
        (400, "validation_failed"),
    ),
    "derived key too long": (
        OPERATOR_KEY,
        {**REFUND, "input": {"orderId": "o" * 300}},
        (400, "validation_failed"),
    ),
    "invalid body": (OPERATOR_KEY, {"capabilityId": "send-email"}, (400, "validation_failed")),
    "number too wide": (
        OPERATOR_KEY,
        {**EMAIL, "input": {"v": [1e308]}},
        (400, "validation_failed"),
    ),
    "missing scope": (READ_ONLY_KEY, EMAIL, (403, "forbidden")),
    "valid": (OPERATOR_KEY, EMAIL, (503, "service_unavailable")),
}


async def test_refusals_that_need_no_database_keep_their_4xx_while_it_is_down(
    unreachable_api: httpx.AsyncClient,
) -> None:
    answers = {}
    for name, (key, body, _) in WITHOUT_THE_DATABASE.items():
        response = await unreachable_api.post("/v1/tool-calls", json=body, headers=bearer(key))
        answers[name] = (response.status_code, response.json()["code"])

    assert answers == {name: expected for name, (_, _, expected) in WITHOUT_THE_DATABASE.items()}
