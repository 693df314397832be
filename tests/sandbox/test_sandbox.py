"""The sandbox provider's contract, over real HTTP, once per store (memory, PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import devtools.sandbox
from devtools.sandbox import SandboxServer


@pytest.fixture(params=["memory", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[SandboxServer]:
    url = request.getfixturevalue("database_url") if request.param == "postgresql" else None
    async with SandboxServer(database_url=url) as server:
        yield server


@pytest.fixture
async def client(sandbox: SandboxServer) -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(base_url=sandbox.url, timeout=10, limits=limits) as c:
        yield c


async def post(
    client: httpx.AsyncClient, key: str | None, body: Any, **headers: str
) -> httpx.Response:
    if key is not None:
        headers["Idempotency-Key"] = key
    return await client.post("/v1/requests", json=body, headers=headers)


async def effects(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/v1/effects")
    assert response.status_code == 200
    result: dict[str, Any] = response.json()
    return result


def test_public_surface_is_pinned() -> None:
    assert sorted(devtools.sandbox.__all__) == [
        "Fault",
        "FaultKind",
        "FaultRule",
        "MemoryStore",
        "PostgresStore",
        "RequestStatus",
        "SandboxServer",
        "SandboxStore",
        "serve_sandbox",
    ]


async def test_same_key_returns_the_original_answer_and_applies_once(
    client: httpx.AsyncClient,
) -> None:
    first = await post(client, "refund:1", {"orderId": "o-1", "amount": 5})
    assert first.status_code == 200
    body = first.json()
    assert body["status"] == "succeeded"
    assert body["idempotencyKey"] == "refund:1"
    assert body["result"] == {"echo": {"orderId": "o-1", "amount": 5}}
    assert body["externalRequestId"].startswith("req_")

    # Same body with its keys in another order: still the same request.
    again = await post(client, "refund:1", {"amount": 5, "orderId": "o-1"})
    assert again.status_code == 200
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"

    counts = await effects(client)
    assert counts["effects"] == {"refund:1": 1}
    assert counts["total"] == 1
    assert counts["received"] == {"refund:1": 2}


async def test_same_key_with_another_body_is_422_and_applies_nothing(
    client: httpx.AsyncClient,
) -> None:
    await post(client, "k", {"amount": 5})
    reused = await post(client, "k", {"amount": 6})
    assert reused.status_code == 422
    assert reused.json()["code"] == "idempotency_key_reused"
    assert (await effects(client))["effects"] == {"k": 1}


async def test_missing_idempotency_key_is_400(client: httpx.AsyncClient) -> None:
    response = await post(client, None, {"amount": 5})
    assert response.status_code == 400
    assert response.json()["code"] == "missing_idempotency_key"
    assert (await effects(client))["total"] == 0


async def test_fifty_concurrent_identical_requests_apply_one_effect(
    client: httpx.AsyncClient,
) -> None:
    responses = await asyncio.gather(*(post(client, "same", {"n": 1}) for _ in range(50)))
    assert {r.status_code for r in responses} == {200}
    assert len({r.json()["externalRequestId"] for r in responses}) == 1
    assert sum("idempotent-replayed" not in r.headers for r in responses) == 1
    counts = await effects(client)
    assert counts["effects"] == {"same": 1}
    assert counts["received"] == {"same": 50}


async def test_lookup_by_id_and_by_key(client: httpx.AsyncClient) -> None:
    created = (await post(client, "look", {"x": 1})).json()
    by_id = await client.get(f"/v1/requests/{created['externalRequestId']}")
    by_key = await client.get("/v1/requests", params={"idempotencyKey": "look"})
    assert by_id.status_code == by_key.status_code == 200
    assert by_id.json() == by_key.json() == created

    missing = await client.get("/v1/requests/req_nope")
    assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
    missing = await client.get("/v1/requests", params={"idempotencyKey": "nope"})
    assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
    no_param = await client.get("/v1/requests")
    assert no_param.status_code == 400


async def test_pending_succeeds_after_n_lookups(client: httpx.AsyncClient) -> None:
    accepted = await post(client, "slow", {"simulate": "pending", "pendingLookups": 2})
    assert accepted.status_code == 202
    assert accepted.json()["status"] == "pending"
    assert accepted.json()["result"] is None
    external_id = accepted.json()["externalRequestId"]
    # Not applied until it settles, so a failure while pending would leave nothing behind.
    assert (await effects(client))["total"] == 0

    first = await client.get(f"/v1/requests/{external_id}")
    second = await client.get("/v1/requests", params={"idempotencyKey": "slow"})
    third = await client.get(f"/v1/requests/{external_id}")
    assert [r.json()["status"] for r in (first, second, third)] == [
        "pending",
        "pending",
        "succeeded",
    ]
    assert third.json()["result"] == {"echo": {"simulate": "pending", "pendingLookups": 2}}
    assert (await effects(client))["effects"] == {"slow": 1}

    # A replay returns the original answer, as the contract promises.
    replay = await post(client, "slow", {"simulate": "pending", "pendingLookups": 2})
    assert (replay.status_code, replay.content) == (202, accepted.content)
    assert (await client.get(f"/v1/requests/{external_id}")).json()["status"] == "succeeded"
    assert (await effects(client))["effects"] == {"slow": 1}


async def test_pending_can_settle_as_failed(client: httpx.AsyncClient) -> None:
    body = {"simulate": "pending", "pendingLookups": 0, "pendingOutcome": "failed"}
    external_id = (await post(client, "p-fail", body)).json()["externalRequestId"]
    settled = (await client.get(f"/v1/requests/{external_id}")).json()
    assert settled["status"] == "failed"
    assert settled["error"]["code"] == "simulated_failure"
    assert (await effects(client))["total"] == 0


async def test_failed_is_final_and_applies_nothing(client: httpx.AsyncClient) -> None:
    failed = await post(client, "nope", {"simulate": "fail"})
    assert failed.status_code == 200
    assert failed.json()["status"] == "failed"
    assert failed.json()["error"]["code"] == "simulated_failure"
    assert failed.json()["result"] is None
    replay = await post(client, "nope", {"simulate": "fail"})
    assert replay.content == failed.content
    assert (await effects(client))["total"] == 0


@pytest.mark.parametrize(
    "content",
    [b'{"simulate": "invalid"}', b"[1, 2]", b"not json", b'{"simulate": "explode"}'],
)
async def test_invalid_request_is_400_and_records_nothing(
    client: httpx.AsyncClient, content: bytes
) -> None:
    response = await client.post(
        "/v1/requests", content=content, headers={"Idempotency-Key": "bad"}
    )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    lookup = await client.get("/v1/requests", params={"idempotencyKey": "bad"})
    assert lookup.status_code == 404
    assert (await effects(client))["total"] == 0


async def test_reverse_is_idempotent_and_counted(client: httpx.AsyncClient) -> None:
    external_id = (await post(client, "r", {"amount": 5})).json()["externalRequestId"]
    path = f"/v1/requests/{external_id}/reverse"
    headers = {"Idempotency-Key": "compensate:r"}
    first = await client.post(path, headers=headers)
    assert first.status_code == 200
    assert first.json()["status"] == "reversed"
    assert first.json()["externalRequestId"] == external_id
    assert first.json()["reversalKey"] == "compensate:r"
    second = await client.post(path, headers=headers)
    assert second.content == first.content

    counts = await effects(client)
    assert counts["effects"] == {"r": 1}
    assert counts["reversals"] == {"r": 1}
    assert counts["received"] == {"r": 1, "compensate:r": 2}
    assert (await client.get(f"/v1/requests/{external_id}")).json()["reversed"] is True


async def test_concurrent_reversals_reverse_once(client: httpx.AsyncClient) -> None:
    external_id = (await post(client, "rc", {"amount": 5})).json()["externalRequestId"]
    path = f"/v1/requests/{external_id}/reverse"
    replies = await asyncio.gather(
        *(client.post(path, headers={"Idempotency-Key": "compensate:rc"}) for _ in range(20))
    )
    assert len({r.content for r in replies}) == 1
    assert (await effects(client))["reversals"] == {"rc": 1}


async def test_reverse_refusals(client: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": "compensate:x"}
    unknown = await client.post("/v1/requests/req_nope/reverse", headers=headers)
    assert (unknown.status_code, unknown.json()["code"]) == (404, "not_found")

    failed = (await post(client, "f", {"simulate": "fail"})).json()["externalRequestId"]
    refused = await client.post(f"/v1/requests/{failed}/reverse", headers=headers)
    assert (refused.status_code, refused.json()["code"]) == (409, "not_reversible")

    pending = (await post(client, "p", {"simulate": "pending"})).json()["externalRequestId"]
    refused = await client.post(f"/v1/requests/{pending}/reverse", headers=headers)
    assert refused.status_code == 409

    done = (await post(client, "d", {})).json()["externalRequestId"]
    no_key = await client.post(f"/v1/requests/{done}/reverse")
    assert (no_key.status_code, no_key.json()["code"]) == (400, "missing_idempotency_key")
    assert (await effects(client))["reversals"] == {}


async def test_each_requests_traceparent_is_kept_by_key(client: httpx.AsyncClient) -> None:
    first, second = (f"00-{'a' * 32}-{c * 16}-01" for c in "bc")
    await post(client, "traced", {}, traceparent=first)
    await post(client, "traced", {}, traceparent=second)
    await post(client, "untraced", {})
    assert (await effects(client))["traceparents"] == {"traced": [first, second]}


async def test_reset_forgets_everything(client: httpx.AsyncClient) -> None:
    await post(client, "gone", {}, traceparent=f"00-{'a' * 32}-{'b' * 16}-01")
    assert (await client.post("/v1/reset")).status_code == 200
    assert await effects(client) == {
        "effects": {},
        "reversals": {},
        "received": {},
        "traceparents": {},
        "total": 0,
    }
    again = await post(client, "gone", {"other": True})
    assert again.status_code == 200  # the key is free again


async def test_unknown_routes_and_methods(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/nothing")).status_code == 404
    assert (await client.delete("/v1/requests")).status_code == 405
    assert (await client.put("/v1/requests/req_x")).status_code == 405
    assert (await client.get("/v1/requests/req_x/reverse")).status_code == 405
    health = await client.get("/v1/health")
    assert health.json()["status"] == "ok"
