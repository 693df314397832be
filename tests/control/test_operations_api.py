"""Bulk operations through the real HTTP API (uvicorn on loopback), worked by the real
processor on the test's database: the filters select what they say, a dry run counts
what the operation then touches, a tenant never sees nor touches another tenant's calls
(even with the same toolCallIds) without the ``admin`` scope, bad requests are
problem+json with a stable code, a cancelled operation touches nothing more, and an
operation never touches a call twice, even run again from the start."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import (
    bulk_operations,
    execution_events,
    outbox,
    tool_calls,
    webhook_notifications,
)
from dispatcher.operations.processor import Processor, step
from dispatcher.settings import ApiKey, Settings, Topics, hash_api_key
from tests.fixtures.api import GLOBEX, OPERATOR, READER, bearer, control_keys
from tests.fixtures.operations import failed_calls, retried_events, statuses, touched_rows
from tests.fixtures.rows import call_row

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
ADMIN = "tdk_test_acme_admin"
OPS = "/v1/operations"


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    admin = ApiKey(
        sha256=hash_api_key(ADMIN), tenant="acme", scopes=["operate", "admin"], name="root"
    )
    return settings.model_copy(update={"api_keys": [*control_keys(), admin]})


def processor(sessions: Sessions, registry: CapabilityRegistry, batch: int = 3) -> Processor:
    return Processor(
        sessions=sessions,
        registry=registry,
        topics=Topics(events="events"),
        owner="test-processor",
        batch_size=batch,
        lease_seconds=30,
    )


async def work(sessions: Sessions, registry: CapabilityRegistry) -> None:
    """What a worker's operations loop does in one step: every free operation, through."""
    import asyncio

    await step(processor(sessions, registry), asyncio.Event())


def retry(**filter_: Any) -> dict[str, Any]:
    return {"kind": "retry", "reason": "provider fixed", "filter": filter_}


async def post(api: httpx.AsyncClient, body: dict[str, Any], key: str = OPERATOR) -> Any:
    return await api.post(OPS, json=body, headers=bearer(key))


async def test_filters_select_what_they_say_and_the_dry_run_counts_what_is_touched(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    await failed_calls(sessions, ["s1", "s2", "s3"], capability_id="send")
    await failed_calls(sessions, ["r1", "r2"], capability_id="refund", run_id="run-2")
    await failed_calls(sessions, ["t1"], capability_id="send", last_error="request not sendable")
    await failed_calls(sessions, ["old"], capability_id="send", age_seconds=7200)
    await failed_calls(sessions, ["e1"], status="escalated")
    await failed_calls(sessions, ["c1"], status="completed")

    async def count(**filter_: Any) -> int:
        reply = await post(api, retry(**filter_) | {"dryRun": True})
        assert reply.status_code == 200, reply.text
        return int(reply.json()["count"])

    assert await count() == 7
    assert await count(capabilityId="refund") == 2
    assert await count(runId="run-2") == 2
    assert await count(lastError="provider refused") == 6
    assert await count(lastError="request not") == 1
    assert await count(status=["escalated"]) == 1
    assert await count(status=["failed", "escalated"]) == 8
    since = (await api.get("/healthz")).headers.get("date")  # only to show it is served
    assert since
    recent = "2000-01-01T00:00:00Z"
    assert await count(since=recent) == 7
    # The query flag is a dry run too; its sample is in the operation's order.
    reply = await api.post(
        OPS + "?dryRun=true", json=retry(capabilityId="send"), headers=bearer(OPERATOR)
    )
    body = reply.json()
    assert (body["dryRun"], body["count"]) == (True, 5)
    assert [c["toolCallId"] for c in body["sample"]][:1] == ["old"]
    assert await statuses(sessions, "acme") == {
        **{c: "failed" for c in ("s1", "s2", "s3", "r1", "r2", "t1", "old")},
        "e1": "escalated",
        "c1": "completed",
    }

    made = await post(api, retry(capabilityId="send", lastError="provider refused"))
    assert made.status_code == 201, made.text
    op = made.json()
    assert (op["state"], op["total"], op["done"]) == ("running", 4, 0)
    await work(sessions, registry)
    shown = (await api.get(f"{OPS}/{op['operationId']}", headers=bearer(OPERATOR))).json()
    assert (shown["state"], shown["total"], shown["done"], shown["failed"]) == (
        "completed", 4, 4, 0,
    )  # fmt: skip
    after = await statuses(sessions, "acme")
    assert sorted(c for c, s in after.items() if s == "authorized") == ["old", "s1", "s2", "s3"]
    events = await retried_events(sessions, "acme")
    assert sorted(e["tool_call_id"] for e in events) == ["old", "s1", "s2", "s3"]
    assert {e["causation_id"] for e in events} == {op["operationId"]}
    async with sessions() as session:
        told = await session.execute(
            select(webhook_notifications.c.tenant, webhook_notifications.c.data).where(
                webhook_notifications.c.event_type == "operation.finished"
            )
        )
        assert [(t, d["operationId"], d["state"], d["done"]) for t, d in told] == [
            ("acme", op["operationId"], "completed", 4)
        ]


async def test_a_tenant_never_touches_another_tenants_calls_without_admin(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    same_ids = ["x1", "x2", "x3"]
    await failed_calls(sessions, same_ids, tenant="acme")
    await failed_calls(sessions, same_ids, tenant="globex")
    # Another tenant, or every tenant, needs admin.
    for scope in ({"tenant": "globex"}, {"everyTenant": True}):
        refused = await post(api, retry(**scope) | {"dryRun": True})
        assert refused.status_code == 403, refused.text
        assert refused.json()["code"] == "forbidden"
    mine = await post(api, retry())
    assert mine.json()["total"] == 3
    await work(sessions, registry)
    assert set((await statuses(sessions, "acme")).values()) == {"authorized"}
    assert set((await statuses(sessions, "globex")).values()) == {"failed"}
    assert await retried_events(sessions, "globex") == []
    # Not globex's to read or cancel; an admin reads it.
    path = f"{OPS}/{mine.json()['operationId']}"
    for reply in (
        await api.get(path, headers=bearer(GLOBEX)),
        await api.post(path + "/cancel", headers=bearer(GLOBEX)),
        await api.get(path + "/calls", headers=bearer(GLOBEX)),
    ):
        assert (reply.status_code, reply.json()["code"]) == (404, "operation_not_found")
    assert (await api.get(path, headers=bearer(ADMIN))).json()["state"] == "completed"
    # An admin's operation over every tenant touches globex's calls, each in its tenant.
    every = await post(api, retry(everyTenant=True), key=ADMIN)
    assert every.json()["total"] == 3
    await work(sessions, registry)
    assert set((await statuses(sessions, "globex")).values()) == {"authorized"}
    touched = await touched_rows(sessions, every.json()["operationId"])
    assert sorted((t["tenant"], t["tool_call_id"]) for t in touched) == [
        ("globex", i) for i in same_ids
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "explode", "reason": "r"}, "kind"),
        ({"kind": "retry"}, "reason"),
        (retry(status=["completed"]), ""),
        (retry(status=["proposed"]), ""),
        ({"kind": "resolve", "reason": "r"}, ""),
        (retry(since="2026-01-02T00:00:00Z", until="2026-01-01T00:00:00Z"), "filter"),
        (retry(since="2026-01-01T00:00:00"), "filter.since"),
        (retry(tenant="globex", everyTenant=True), "filter"),
        (retry(capabilityId="a/b"), "filter.capabilityId"),
        (retry(colour="red"), "filter.colour"),
    ],
)
async def test_a_bad_operation_is_a_problem_with_a_stable_code(
    api: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    reply = await post(api, body)
    assert reply.status_code == 400, reply.text
    assert reply.headers["content-type"] == "application/problem+json"
    assert reply.json()["code"] == "validation_failed"
    assert reply.json()["field"].startswith(field)


async def test_unknown_and_finished_operations_and_scopes_answer_their_codes(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    missing = await api.get(f"{OPS}/op_nothing", headers=bearer(OPERATOR))
    assert (missing.status_code, missing.json()["code"]) == (404, "operation_not_found")
    no_scope = await post(api, retry(), key=READER)
    assert (no_scope.status_code, no_scope.json()["code"]) == (403, "forbidden")
    await failed_calls(sessions, ["f1"])
    made = (await post(api, retry())).json()
    await work(sessions, registry)
    again = await api.post(f"{OPS}/{made['operationId']}/cancel", headers=bearer(OPERATOR))
    assert (again.status_code, again.json()["code"]) == (409, "operation_finished")
    assert again.json()["state"] == "completed"


async def test_a_cancelled_operation_touches_nothing_more(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    ids = [f"c{i}" for i in range(7)]
    await failed_calls(sessions, ids)
    made = (await post(api, retry())).json()
    p = processor(sessions, registry)
    from dispatcher.operations.processor import claim, run_batch

    assert await claim(p) == made["operationId"]
    assert await run_batch(p, made["operationId"]) is True  # one batch of 3
    cancelled = await api.post(f"{OPS}/{made['operationId']}/cancel", headers=bearer(OPERATOR))
    assert cancelled.status_code == 200, cancelled.text
    assert (cancelled.json()["state"], cancelled.json()["done"]) == ("cancelled", 3)
    assert cancelled.json()["cancelledBy"]["name"] == "oncall"
    async with sessions() as session:
        told = await session.execute(
            select(webhook_notifications.c.tenant, webhook_notifications.c.data).where(
                webhook_notifications.c.event_type == "operation.finished"
            )
        )
        assert [(t, d["state"], d["done"]) for t, d in told] == [("acme", "cancelled", 3)]
    assert await run_batch(p, made["operationId"]) is False
    await work(sessions, registry)
    assert (
        sorted((await statuses(sessions, "acme")).values()) == ["authorized"] * 3 + ["failed"] * 4
    )
    assert len(await retried_events(sessions, "acme")) == 3


async def test_a_processor_that_stops_between_batches_hands_its_operation_on_at_once(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    import asyncio

    from dispatcher.operations.processor import claim, work_through

    await failed_calls(sessions, [f"c{i}" for i in range(7)])
    made = (await post(api, retry())).json()
    first = processor(sessions, registry)
    assert await claim(first) == made["operationId"]
    stop = asyncio.Event()
    stop.set()  # SIGTERM came: no batch more
    await work_through(first, made["operationId"], stop)
    # Its lease (30 s) was given up: another processor takes the operation now.
    other = replace(first, owner="other-processor")
    assert await claim(other) == made["operationId"]


async def test_a_key_replays_its_request_and_refuses_another(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    await failed_calls(sessions, ["k1", "k2"])
    body = retry(capabilityId="send") | {"idempotencyKey": "nightly"}
    first = await post(api, body)
    assert first.status_code == 201, first.text
    made = first.json()["operationId"]
    # The same request, sent by another key of the tenant: the operation it made.
    again = await post(api, body, key=ADMIN)
    assert (again.status_code, again.json()["operationId"]) == (200, made)
    for other in (
        {"kind": "cancel"},
        {"filter": {"capabilityId": "refund"}},
        {"reason": "another reason"},
        {"newIdempotencyKey": True},
    ):
        refused = await post(api, body | other)
        assert refused.status_code == 422, (other, refused.text)
        assert refused.headers["content-type"] == "application/problem+json"
        problem = refused.json()
        assert (problem["code"], problem["operationId"]) == ("idempotency_key_reused", made)
        assert problem["idempotencyKey"] == "nightly" and "toolCallId" not in problem
    # Another tenant's same key is its own.
    assert (await post(api, body, key=GLOBEX)).status_code == 201
    async with sessions() as session:
        kept = await session.execute(
            select(bulk_operations.c.tenant).where(bulk_operations.c.idempotency_key == "nightly")
        )
        assert sorted(kept.scalars()) == ["acme", "globex"]


async def test_an_operation_touches_a_call_at_most_once(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    ids = [f"i{i}" for i in range(5)]
    await failed_calls(sessions, ids)
    body = retry() | {"idempotencyKey": "nightly-retry"}
    first = await post(api, body)
    second = await post(api, body)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["operationId"] == second.json()["operationId"]
    operation_id = first.json()["operationId"]
    await work(sessions, registry)
    # The calls fail again as they were, and the operation is run from its start once
    # more (as a processor whose cursor was lost would): nothing is touched twice.
    async with sessions() as session, session.begin():
        submitted = (
            select(bulk_operations.c.created_at)
            .where(bulk_operations.c.operation_id == operation_id)
            .scalar_subquery()
        )
        await session.execute(
            update(tool_calls)
            .where(tool_calls.c.tenant == "acme")
            .values(status="failed", updated_at=submitted)
        )
        await session.execute(
            update(bulk_operations)
            .where(bulk_operations.c.operation_id == operation_id)
            .values(state="running", cursor=None, lease_owner=None, lease_expires_at=None)
        )
    await work(sessions, registry)
    events = await retried_events(sessions, "acme")
    assert sorted(e["tool_call_id"] for e in events) == ids
    assert len(await touched_rows(sessions, operation_id)) == 5
    shown = (await api.get(f"{OPS}/{operation_id}", headers=bearer(OPERATOR))).json()
    assert (shown["state"], shown["done"]) == ("completed", 5)
    page = (await api.get(f"{OPS}/{operation_id}/calls?limit=2", headers=bearer(OPERATOR))).json()
    assert [c["toolCallId"] for c in page["calls"]] == ids[:2]
    rest = await api.get(
        f"{OPS}/{operation_id}/calls?limit=10&after={page['next']}", headers=bearer(OPERATOR)
    )
    assert [c["toolCallId"] for c in rest.json()["calls"]] == ids[2:]
    assert rest.json()["next"] is None


async def command_of(sessions: Sessions, tool_call_id: str) -> dict[str, Any]:
    async with sessions() as session:
        row = (
            await session.execute(
                select(outbox.c.headers, outbox.c.payload).where(
                    outbox.c.payload["toolCallId"].astext == tool_call_id,
                    outbox.c.headers["ce_type"].astext == "tool.call.dispatch",
                )
            )
        ).one()
        return {"headers": row.headers, "payload": row.payload}


async def test_a_bulk_retry_writes_what_a_single_retry_writes(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    await failed_calls(sessions, ["one", "many"])
    await failed_calls(sessions, ["halted"], run_id="run-halted")
    stopped = await api.post(
        "/v1/runs/run-halted/stop", json={"reason": "enough"}, headers=bearer(OPERATOR)
    )
    assert stopped.status_code == 200, stopped.text
    single = await api.post(
        "/v1/tool-calls/one/retry", json={"reason": "provider fixed"}, headers=bearer(OPERATOR)
    )
    assert single.status_code == 200, single.text
    op = (await post(api, retry())).json()
    await work(sessions, registry)
    shown = (await api.get(f"{OPS}/{op['operationId']}", headers=bearer(OPERATOR))).json()
    assert (shown["total"], shown["done"], shown["failed"]) == (2, 1, 1)
    refused = [t for t in await touched_rows(sessions, op["operationId"]) if t["outcome"] != "done"]
    assert [(t["tool_call_id"], t["code"]) for t in refused] == [("halted", "run_stopped")]
    e = execution_events.c
    async with sessions() as session:
        found = await session.execute(
            select(e.tool_call_id, e.event_id, e.producer, e.causation_id, e.payload).where(
                e.event_type == "tool.call.retried"
            )
        )
        events = {r.tool_call_id: r for r in found}
    assert set(events) == {"one", "many"}
    one, many = events["one"], events["many"]
    assert (one.causation_id, many.causation_id) == (None, op["operationId"])
    assert one.producer == many.producer
    assert many.payload == {
        k: (v.replace("one", "many") if isinstance(v, str) else v) for k, v in one.payload.items()
    }
    calls = {c: await call_row(sessions, c) for c in ("one", "many")}
    same = ("status", "verification_status", "reconciliation_status", "lease_owner",
            "completed_at", "last_error", "version", "next_reconcile_at")  # fmt: skip
    assert [calls["one"][n] for n in same] == [calls["many"][n] for n in same]
    commands = {c: await command_of(sessions, c) for c in ("one", "many")}
    for call, event in (("one", one), ("many", many)):
        assert commands[call]["payload"]["causationId"] == event.event_id
    assert commands["one"]["headers"]["ce_source"] == commands["many"]["headers"]["ce_source"]
