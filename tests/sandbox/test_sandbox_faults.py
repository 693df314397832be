"""Faults on demand, observed as a worker observes them: through httpx exception types
and status codes of a real httpx.AsyncClient, then checked against the effect counts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from devtools.sandbox import SandboxServer


@pytest.fixture(params=["memory", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[SandboxServer]:
    url = request.getfixturevalue("database_url") if request.param == "postgresql" else None
    async with SandboxServer(database_url=url) as server:
        yield server


@pytest.fixture
async def memory_sandbox() -> AsyncIterator[SandboxServer]:
    async with SandboxServer() as server:
        yield server


@pytest.fixture
async def client(memory_sandbox: SandboxServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=memory_sandbox.url, timeout=5) as c:
        yield c


async def post(
    client: httpx.AsyncClient, key: str, fault: str | None = None, **kwargs: Any
) -> httpx.Response:
    headers = {"Idempotency-Key": key}
    if fault is not None:
        headers["X-Sandbox-Fault"] = fault
    return await client.post("/v1/requests", json={"key": key}, headers=headers, **kwargs)


async def effects(client: httpx.AsyncClient) -> dict[str, Any]:
    result: dict[str, Any] = (await client.get("/v1/effects")).json()
    return result


async def until_received(client: httpx.AsyncClient, key: str, task: asyncio.Task[Any]) -> None:
    """Until the sandbox has received (and is handling) the request of ``key`` that
    ``task`` sends; fails if ``task`` ends first."""
    while (await effects(client))["received"].get(key) != 1:
        assert not task.done(), task
        await asyncio.sleep(0.01)


async def add_rules(client: httpx.AsyncClient, rules: Any) -> list[dict[str, Any]]:
    response = await client.post("/v1/faults", json=rules)
    assert response.status_code == 200, response.text
    installed: list[dict[str, Any]] = response.json()["rules"]
    return installed


async def test_drop_after_apply_loses_the_answer_but_not_the_effect(
    sandbox: SandboxServer,
) -> None:
    async with httpx.AsyncClient(base_url=sandbox.url, timeout=5) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await post(client, "lost", "drop-after-apply")
        assert (await effects(client))["effects"] == {"lost": 1}
        # What a reconciler does: find the request by its key, then replay safely.
        found = await client.get("/v1/requests", params={"idempotencyKey": "lost"})
        assert found.json()["status"] == "succeeded"
        replay = await post(client, "lost")
        assert replay.json()["externalRequestId"] == found.json()["externalRequestId"]
        assert (await effects(client))["effects"] == {"lost": 1}


async def test_drop_with_reset_is_a_read_error(client: httpx.AsyncClient) -> None:
    with pytest.raises(httpx.ReadError):
        await post(client, "rst", "drop_after_apply; reset=true")
    assert (await effects(client))["effects"] == {"rst": 1}


async def test_drop_before_apply_applies_nothing(client: httpx.AsyncClient) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        await post(client, "early", "drop-before-apply")
    counts = await effects(client)
    assert counts["effects"] == {}
    assert counts["received"] == {"early": 1}
    lookup = await client.get("/v1/requests", params={"idempotencyKey": "early"})
    assert lookup.status_code == 404


@pytest.mark.parametrize(("apply", "expected"), [("true", {"slow": 1}), ("false", {})])
async def test_timeout_fires_the_clients_read_timeout(
    client: httpx.AsyncClient, apply: str, expected: dict[str, int]
) -> None:
    with pytest.raises(httpx.ReadTimeout):
        await post(client, "slow", f"timeout; apply={apply}", timeout=0.3)
    assert (await effects(client))["effects"] == expected


async def test_timeout_with_seconds_closes_without_answering(client: httpx.AsyncClient) -> None:
    started = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):
        await post(client, "held", "timeout; seconds=0.3", timeout=5)
    assert time.monotonic() - started >= 0.3


async def test_latency_then_a_normal_answer(client: httpx.AsyncClient) -> None:
    started = time.monotonic()
    response = await post(client, "lag", "latency; latencyMs=200")
    assert time.monotonic() - started >= 0.2
    assert response.status_code == 200
    assert (await effects(client))["effects"] == {"lag": 1}


async def test_error_applies_nothing_and_a_retry_succeeds(client: httpx.AsyncClient) -> None:
    failed = await post(client, "e", "error; status=502")
    assert (failed.status_code, failed.json()["code"]) == (502, "internal_error")
    assert (await effects(client))["effects"] == {}
    assert (await post(client, "e")).status_code == 200
    assert (await effects(client))["effects"] == {"e": 1}


@pytest.mark.parametrize(
    ("status", "code"),
    [(408, "request_timeout"), (409, "in_flight"), (422, "rejected"), (400, "rejected")],
)
async def test_error_answers_any_4xx_and_applies_nothing(
    client: httpx.AsyncClient, status: int, code: str
) -> None:
    """The provider contract's 4xx cases (408 and 409 are "no definitive answer", the
    rest refusals) can be driven through the sandbox."""
    failed = await post(client, f"e{status}", f"error; status={status}")
    assert (failed.status_code, failed.json()["code"]) == (status, code)
    rule = {"kind": "error", "status": status, "idempotencyKey": f"r{status}", "times": 1}
    assert (await client.post("/v1/faults", json=rule)).status_code == 200
    assert (await post(client, f"r{status}")).status_code == status
    assert (await effects(client))["effects"] == {}
    assert (await post(client, f"r{status}")).status_code == 200  # the rule was used up


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [("rate_limit; retryAfter=3", 429, "rate_limited"), ("unavailable; retryAfter=3", 503, None)],
)
async def test_refusals_carry_retry_after(
    client: httpx.AsyncClient, fault: str, status: int, code: str | None
) -> None:
    response = await post(client, "busy", fault)
    assert response.status_code == status
    assert response.headers["retry-after"] == "3"
    assert response.json()["code"] == (code or "unavailable")
    assert (await effects(client))["effects"] == {}


async def test_rule_by_key_applies_times_then_stops(client: httpx.AsyncClient) -> None:
    [rule] = await add_rules(
        client, {"idempotencyKey": "k", "kind": "unavailable", "retryAfter": 2, "times": 2}
    )
    assert (rule["kind"], rule["times"]) == ("unavailable", 2)
    assert (await post(client, "other")).status_code == 200  # not matched, not counted
    assert (await post(client, "k")).status_code == 503
    assert (await client.get("/v1/faults")).json()["rules"][0]["times"] == 1
    assert (await post(client, "k")).status_code == 503
    assert (await client.get("/v1/faults")).json()["rules"] == []
    assert (await post(client, "k")).status_code == 200
    assert (await effects(client))["received"] == {"other": 1, "k": 3}


async def test_rule_by_key_prefix_and_delete(client: httpx.AsyncClient) -> None:
    await add_rules(client, [{"keyPrefix": "refund:", "kind": "drop_after_apply"}])
    for key in ("refund:1", "refund:2"):
        with pytest.raises(httpx.RemoteProtocolError):
            await post(client, key)
    assert (await post(client, "email:1")).status_code == 200
    cleared = await client.delete("/v1/faults")
    assert cleared.json()["rules"] == []
    assert (await post(client, "refund:1")).status_code == 200  # the replay answers now
    assert (await effects(client))["effects"] == {"refund:1": 1, "refund:2": 1, "email:1": 1}


async def test_lookups_can_be_faulted(client: httpx.AsyncClient) -> None:
    created = (await post(client, "look")).json()
    await add_rules(
        client,
        [
            {"method": "GET", "pathPrefix": "/v1/requests/", "kind": "timeout", "times": 1},
            {"method": "GET", "idempotencyKey": "look", "kind": "error", "status": 500},
        ],
    )
    with pytest.raises(httpx.ReadTimeout):
        await client.get(f"/v1/requests/{created['externalRequestId']}", timeout=0.3)
    by_key = await client.get("/v1/requests", params={"idempotencyKey": "look"})
    assert by_key.status_code == 500
    # The POST path is untouched by GET rules: a replay still answers.
    assert (await post(client, "look")).json() == created


async def test_admin_endpoints_are_never_faulted(client: httpx.AsyncClient) -> None:
    await add_rules(client, {"kind": "drop_before_apply"})  # matches every request
    with pytest.raises(httpx.RemoteProtocolError):
        await post(client, "x")
    assert (await client.get("/v1/effects")).status_code == 200
    assert (await client.get("/v1/health")).status_code == 200
    assert (await client.post("/v1/reset")).status_code == 200
    assert (await client.get("/v1/faults")).json()["rules"] == []


@pytest.mark.parametrize(
    "rule",
    [
        {"kind": "meltdown"},
        {"kind": "error", "status": 399},
        {"kind": "error", "status": 600},
        {"kind": "timeout", "seconds": -1},
        {"kind": "latency", "times": 0},
        {"kind": "latency", "keyPrefx": "typo"},
        [],
        "drop",
    ],
)
async def test_bad_rules_are_400(client: httpx.AsyncClient, rule: Any) -> None:
    response = await client.post("/v1/faults", json=rule)
    assert (response.status_code, response.json()["code"]) == (400, "invalid_fault")
    assert (await client.get("/v1/faults")).json()["rules"] == []


async def test_bad_fault_header_is_400_and_applies_nothing(client: httpx.AsyncClient) -> None:
    response = await post(client, "h", "timeout; wait=3")
    assert (response.status_code, response.json()["code"]) == (400, "invalid_fault")
    assert (await effects(client))["effects"] == {}


async def test_a_held_connection_does_not_block_others(client: httpx.AsyncClient) -> None:
    held = asyncio.create_task(post(client, "held", "timeout", timeout=5))
    await until_received(client, "held", held)
    assert (await post(client, "free")).status_code == 200
    held.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held


async def test_stop_releases_a_connection_held_forever() -> None:
    server = SandboxServer()
    await server.start()
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        held = asyncio.create_task(post(client, "forever", "timeout"))
        await until_received(client, "forever", held)
        # A generous grace: a stop that waited for the held request instead of releasing
        # it would run into the bound rather than finish at once.
        await asyncio.wait_for(server.stop(grace=60), timeout=30)
        with pytest.raises(httpx.RemoteProtocolError):
            await held
