"""The HTTP API over a real uvicorn server on loopback and a real PostgreSQL database:
intake, replays and refusals, tenant isolation of reads, run event logs, health and
metrics."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from devtools.databases import unique_name, with_database
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.engine import engine_for
from dispatcher.db.tables import execution_events, outbox, tool_calls
from dispatcher.settings import Settings, load_settings
from dispatcher.tenancy import ordering_key
from tests.fixtures.api import (
    ACME_KEY,
    ACME_READ_ONLY_KEY,
    GLOBEX_KEY,
    api_keys,
    bearer,
    running_api,
)

pytestmark = pytest.mark.postgres

MAX_BODY_BYTES = 1024
ACME = bearer(ACME_KEY)
GLOBEX = bearer(GLOBEX_KEY)
READ_ONLY = bearer(ACME_READ_ONLY_KEY)

TOOL_CALL_FIELDS = {
    "toolCallId",
    "runId",
    "turnId",
    "capabilityId",
    "input",
    "idempotencyKey",
    "status",
    "verificationStatus",
    "reconciliationStatus",
    "externalRequestId",
    "correlationId",
    "causationId",
    "reasoningObjectId",
    "dispatchedAt",
    "acceptedAt",
    "completedAt",
    "result",
    "resultRef",
    "lastError",
    "version",
    "createdAt",
    "updatedAt",
    "approval",
}
EVENT_FIELDS = {
    "eventId",
    "eventType",
    "runId",
    "turnId",
    "producer",
    "reasoningObjectId",
    "capabilityId",
    "correlationId",
    "causationId",
    "toolCallId",
    "schemaVersion",
    "occurredAt",
    "payload",
}


def refund_body(order_id: str = "o-1", **fields: Any) -> dict[str, Any]:
    """Keyed by the capability's template: ``refund:{input.orderId}:{correlationId}``."""
    return {
        "runId": "run-1",
        "turnId": "turn-1",
        "capabilityId": "refund-order-v2",
        "input": {"orderId": order_id, "amountCents": 500},
        "correlationId": "corr-1",
        **fields,
    }


def email_body(key: str = "email-1", to: str = "ada@example.com", **fields: Any) -> dict[str, Any]:
    return {
        "runId": "run-1",
        "capabilityId": "send-email",
        "input": {"to": to},
        "idempotencyKey": key,
        **fields,
    }


def without(body: dict[str, Any], field: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != field}


async def in_chunks(body: dict[str, Any], size: int = 200) -> AsyncIterator[bytes]:
    """A body sent with ``Transfer-Encoding: chunked`` (no Content-Length)."""
    raw = json.dumps(body).encode()
    for start in range(0, len(raw), size):
        yield raw[start : start + size]


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem: dict[str, Any] = response.json()
    assert problem["status"] == status
    assert problem["code"] == code
    assert problem["type"] == f"urn:tool-dispatcher:problem:{code}"
    assert problem["title"]
    return problem


async def snapshot(engine: AsyncEngine) -> dict[str, list[dict[str, Any]]]:
    async with engine.connect() as conn:
        return {
            table.name: [dict(r._mapping) for r in await conn.execute(select(table))]
            for table in (tool_calls, execution_events, outbox)
        }


@pytest.fixture
def api_settings(database_url: str) -> Settings:
    return load_settings(
        {"database_url": database_url, "api_keys": api_keys(), "max_body_bytes": MAX_BODY_BYTES}
    )


@pytest.fixture
def client(api: httpx.AsyncClient) -> httpx.AsyncClient:
    """An unauthenticated client of the running API; requests pass their own key."""
    return api


# --- intake ---------------------------------------------------------------------------


async def test_submit_records_the_call_and_answers_201(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/tool-calls", json=refund_body(), headers=ACME)

    assert response.status_code == 201, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == TOOL_CALL_FIELDS  # camelCase only; no tenant, no fingerprint
    assert body["runId"] == "run-1"
    assert body["turnId"] == "turn-1"
    assert body["capabilityId"] == "refund-order-v2"
    assert body["input"] == {"orderId": "o-1", "amountCents": 500}
    assert body["status"] == "authorized"
    assert body["idempotencyKey"] == "refund:o-1:corr-1"
    assert body["verificationStatus"] == "not_observed"
    assert body["reconciliationStatus"] == "not_needed"
    assert body["dispatchedAt"] is None
    assert body["version"] == 1
    assert datetime.fromisoformat(body["createdAt"]).tzinfo is not None
    assert response.headers["location"] == f"/v1/tool-calls/{body['toolCallId']}"

    fetched = await client.get(response.headers["location"], headers=ACME)
    assert fetched.status_code == 200
    assert fetched.json() == body


async def test_caller_supplied_tool_call_id_is_kept(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/tool-calls", json=email_body(toolCallId="call-42"), headers=ACME
    )
    assert response.status_code == 201
    assert response.json()["toolCallId"] == "call-42"
    assert response.headers["location"] == "/v1/tool-calls/call-42"


async def test_replay_answers_200_with_the_same_call(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    first = await client.post("/v1/tool-calls", json=refund_body(), headers=ACME)
    before = await snapshot(engine)

    again = await client.post("/v1/tool-calls", json=refund_body(), headers=ACME)

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]
    assert await snapshot(engine) == before


async def test_chunked_body_within_the_limit_is_accepted(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/tool-calls", content=in_chunks(email_body()), headers=ACME)
    assert response.status_code == 201, response.text


Send = Callable[[], dict[str, Any]]

REFUSALS = [
    pytest.param(
        ACME,
        lambda: {"json": email_body(to="grace@example.com")},
        422,
        "idempotency_key_reused",
        id="same-key-other-input",
    ),
    pytest.param(
        ACME,
        lambda: {"json": email_body(key="email-2", capabilityId="no-such-tool")},
        404,
        "capability_not_found",
        id="unknown-capability",
    ),
    pytest.param(
        ACME,
        lambda: {"json": without(email_body(key="email-2"), "runId")},
        400,
        "validation_failed",
        id="missing-run-id",
    ),
    pytest.param(
        ACME,
        lambda: {"json": email_body(key="email-2", url="http://evil.example/")},
        400,
        "validation_failed",
        id="unknown-field",
    ),
    pytest.param(
        ACME,
        lambda: {"json": email_body(key="k" * 256)},
        400,
        "validation_failed",
        id="key-of-256-chars",
    ),
    pytest.param(
        ACME, lambda: {"json": email_body(key="")}, 400, "validation_failed", id="empty-key"
    ),
    pytest.param(
        ACME,
        lambda: {
            "content": b'{"runId": "run-1", "capabilityId": ',
            "headers": {"content-type": "application/json"},
        },
        400,
        "validation_failed",
        id="malformed-json",
    ),
    pytest.param(
        ACME,
        lambda: {"json": email_body(key="email-2", input=["not", "an", "object"])},
        400,
        "validation_failed",
        id="input-not-an-object",
    ),
    pytest.param(
        ACME,
        lambda: {"json": refund_body(correlationId=None)},
        400,
        "validation_failed",
        id="key-template-unrenderable",
    ),
    pytest.param(
        ACME,
        lambda: {"json": email_body(key="email-2", input={"blob": "x" * MAX_BODY_BYTES})},
        413,
        "payload_too_large",
        id="declared-length-too-large",
    ),
    pytest.param(
        ACME,
        lambda: {"content": in_chunks(email_body(key="email-2", input={"x": "x" * 4096}))},
        413,
        "payload_too_large",
        id="chunked-too-large",
    ),
    pytest.param({}, lambda: {"json": email_body()}, 401, "unauthenticated", id="no-credentials"),
    pytest.param(
        bearer("tdk_not_a_configured_key"),
        lambda: {"json": email_body()},
        401,
        "unauthenticated",
        id="unknown-key",
    ),
    pytest.param(
        {"Authorization": f"Basic {ACME_KEY}"},
        lambda: {"json": email_body()},
        401,
        "unauthenticated",
        id="wrong-scheme",
    ),
    pytest.param(READ_ONLY, lambda: {"json": email_body()}, 403, "forbidden", id="read-only-key"),
]


@pytest.mark.parametrize(("auth", "send", "status", "code"), REFUSALS)
async def test_refused_submission_changes_nothing(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    auth: dict[str, str],
    send: Send,
    status: int,
    code: str,
) -> None:
    accepted = await client.post("/v1/tool-calls", json=email_body(), headers=ACME)
    assert accepted.status_code == 201
    before = await snapshot(engine)

    request = send()
    headers = {**request.pop("headers", {}), **auth}
    response = await client.post("/v1/tool-calls", headers=headers, **request)

    assert_problem(response, status, code)
    assert await snapshot(engine) == before
    still = await client.get(accepted.headers["location"], headers=ACME)
    assert still.json() == accepted.json()


async def test_validation_problem_lists_the_offending_fields(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/tool-calls", json=without(email_body(), "runId"), headers=ACME
    )
    problem = assert_problem(response, 400, "validation_failed")
    assert ["runId"] in [error["loc"] for error in problem["errors"]]


async def test_fifty_concurrent_identical_posts_record_one_call(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    async with (
        httpx.AsyncClient(base_url=client.base_url, headers=ACME) as a,
        httpx.AsyncClient(base_url=client.base_url, headers=ACME) as b,
    ):
        responses = await asyncio.gather(
            *((a if n % 2 else b).post("/v1/tool-calls", json=refund_body()) for n in range(50))
        )

    assert Counter(r.status_code for r in responses) == {201: 1, 200: 49}
    assert len({r.json()["toolCallId"] for r in responses}) == 1
    stored = await snapshot(engine)
    assert len(stored["tool_calls"]) == 1
    assert stored["tool_calls"][0]["tool_call_id"] == responses[0].json()["toolCallId"]
    assert len(stored["execution_events"]) == 2
    commands = [m for m in stored["outbox"] if m["topic"] == "tool-dispatcher.commands"]
    assert [m["key"] for m in commands] == [
        ordering_key("acme", stored["tool_calls"][0]["tool_call_id"])
    ]


# --- reads ----------------------------------------------------------------------------


async def test_another_tenants_call_is_not_found(client: httpx.AsyncClient) -> None:
    created = await client.post("/v1/tool-calls", json=email_body(), headers=ACME)
    location = created.headers["location"]

    assert (await client.get(location, headers=ACME)).status_code == 200
    assert (await client.get(location, headers=READ_ONLY)).status_code == 200
    foreign = assert_problem(await client.get(location, headers=GLOBEX), 404, "tool_call_not_found")
    missing = assert_problem(
        await client.get("/v1/tool-calls/no-such-call", headers=GLOBEX), 404, "tool_call_not_found"
    )
    # Indistinguishable from a call that does not exist.
    assert without(without(foreign, "detail"), "toolCallId") == without(
        without(missing, "detail"), "toolCallId"
    )


async def test_reads_need_credentials(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/v1/tool-calls/x"), 401, "unauthenticated")
    assert_problem(await client.get("/v1/runs/run-1/events"), 401, "unauthenticated")


async def test_run_events_in_order_with_pagination_and_tenant_isolation(
    client: httpx.AsyncClient,
) -> None:
    first = await client.post("/v1/tool-calls", json=refund_body(runId="run-7"), headers=ACME)
    second = await client.post("/v1/tool-calls", json=email_body(runId="run-7"), headers=ACME)
    other_run = await client.post("/v1/tool-calls", json=email_body(key="e-3"), headers=ACME)
    assert {first.status_code, second.status_code, other_run.status_code} == {201}
    first_id, second_id = first.json()["toolCallId"], second.json()["toolCallId"]

    response = await client.get("/v1/runs/run-7/events", headers=ACME)

    assert response.status_code == 200
    page = response.json()
    assert page["runId"] == "run-7"
    events = page["events"]
    assert [(e["toolCallId"], e["eventType"]) for e in events] == [
        (first_id, "tool.call.requested"),
        (first_id, "tool.call.authorized"),
        (second_id, "tool.call.requested"),
        (second_id, "tool.call.authorized"),
    ]
    for event in events:
        assert set(event) == EVENT_FIELDS
        assert event["runId"] == "run-7"
        assert event["producer"] == "tool-dispatcher.intake"
        assert event["schemaVersion"] == 1
        assert event["eventId"].startswith("evt_")
        assert datetime.fromisoformat(event["occurredAt"]).tzinfo is not None
        assert isinstance(event["payload"], dict)
    assert events[0]["turnId"] == "turn-1"
    assert events[0]["capabilityId"] == "refund-order-v2"
    assert events[0]["correlationId"] == "corr-1"
    assert events[1]["causationId"] == events[0]["eventId"]
    assert events[3]["causationId"] == events[2]["eventId"]

    async def page_of(**params: Any) -> list[dict[str, Any]]:
        r = await client.get("/v1/runs/run-7/events", params=params, headers=ACME)
        assert r.status_code == 200
        return list(r.json()["events"])

    assert await page_of(limit=1) == events[:1]
    assert await page_of(after=events[0]["eventId"], limit=2) == events[1:3]
    assert await page_of(after=events[2]["eventId"]) == events[3:]
    assert await page_of(after=events[3]["eventId"]) == []

    globex = await client.get("/v1/runs/run-7/events", headers=GLOBEX)
    assert globex.status_code == 200
    assert globex.json() == {"runId": "run-7", "events": []}
    globex_after = await client.get(
        "/v1/runs/run-7/events", params={"after": events[0]["eventId"]}, headers=GLOBEX
    )
    # Another tenant's event id is as unknown to globex as a made-up one.
    assert_problem(globex_after, 400, "validation_failed")
    made_up = await client.get("/v1/runs/run-7/events", params={"after": "evt_nope"}, headers=ACME)
    assert_problem(made_up, 400, "validation_failed")


async def test_run_events_limit_is_validated(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/runs/run-1/events", params={"limit": 0}, headers=ACME)
    assert_problem(response, 400, "validation_failed")


# --- operations -----------------------------------------------------------------------


async def test_health_and_readiness(client: httpx.AsyncClient) -> None:
    healthz = await client.get("/healthz")
    readyz = await client.get("/readyz")
    assert (healthz.status_code, healthz.json()) == (200, {"status": "ok"})
    assert (readyz.status_code, readyz.json()) == (200, {"status": "ready"})


async def test_readiness_fails_when_the_database_is_unreachable(
    pg_server_url: str, registry: CapabilityRegistry
) -> None:
    missing = with_database(pg_server_url, unique_name("td_does_not_exist"))
    settings = load_settings({"database_url": missing, "api_keys": api_keys()})
    engine = engine_for(missing)
    try:
        async with (
            running_api(settings, registry, engine) as base_url,
            httpx.AsyncClient(base_url=base_url) as http,
        ):
            healthz = await http.get("/healthz")
            readyz = await http.get("/readyz")
    finally:
        await engine.dispose()

    assert healthz.status_code == 200  # alive, just not ready
    assert_problem(readyz, 503, "service_unavailable")


def submissions(metrics_text: str) -> dict[str, float]:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "tool_dispatcher_intake_submissions":
            return {
                s.labels["outcome"]: s.value
                for s in family.samples
                if s.name == "tool_dispatcher_intake_submissions_total"
            }
    return {}


async def test_metrics_count_created_replayed_and_refused_submissions(
    client: httpx.AsyncClient,
) -> None:
    before = submissions((await client.get("/metrics")).text)

    assert (await client.post("/v1/tool-calls", json=email_body(), headers=ACME)).status_code == 201
    for _ in range(2):
        replay = await client.post("/v1/tool-calls", json=email_body(), headers=ACME)
        assert replay.status_code == 200
    reused = await client.post("/v1/tool-calls", json=email_body(to="x@example.com"), headers=ACME)
    assert reused.status_code == 422

    response = await client.get("/metrics")
    assert response.status_code == 200
    assert "tool_dispatcher_intake_submissions_total" in response.text
    after = submissions(response.text)
    assert after["created"] - before.get("created", 0) == 1
    assert after["replayed"] - before.get("replayed", 0) == 2
    assert after["idempotency_key_reused"] - before.get("idempotency_key_reused", 0) == 1


async def test_unknown_route_is_a_problem(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/v1/nothing-here", headers=ACME), 404, "not_found")
    assert_problem(await client.delete("/v1/tool-calls", headers=ACME), 405, "method_not_allowed")
