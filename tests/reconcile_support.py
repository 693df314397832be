"""Helpers for reconciler tests: capabilities with lookups and compensation pointing at
an in-test sandbox, calls driven into result_unknown by real faults, and bulk rows."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import Capability, CapabilityRegistry
from dispatcher.db.tables import escalations, execution_events, outbox, tool_calls
from dispatcher.provider.client import ProviderClient
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.worker.executor import Executor
from reconciler import Reconciler, Tally
from tests.dispatch_support import add_fault, submit_call


def reconcile_capability(
    cap_id: str,
    base_url: str,
    *,
    timeout: float = 2.0,
    lookup_timeout: float = 2.0,
    by_key: bool = True,
    **reconcile: Any,
) -> Capability:
    policy = {"initialDelaySeconds": 0.01, "maxDelaySeconds": 0.05, **reconcile}
    spec: dict[str, Any] = {
        "id": cap_id,
        "sideEffects": True,
        "request": {
            "method": "POST",
            "url": base_url + "/v1/requests",
            "timeoutSeconds": timeout,
        },
        "statusLookup": {
            "method": "GET",
            "url": base_url + "/v1/requests/{externalRequestId}",
            "timeoutSeconds": lookup_timeout,
        },
        "compensation": {
            "method": "POST",
            "url": base_url + "/v1/requests/{externalRequestId}/reverse",
        },
        "retry": {"maxAttempts": 2, "initialBackoffSeconds": 0.01, "maxBackoffSeconds": 0.02},
        "reconcile": policy,
    }
    if by_key:
        spec["lookupByKey"] = {
            "method": "GET",
            "url": base_url + "/v1/requests?idempotencyKey={idempotencyKey}",
            "timeoutSeconds": lookup_timeout,
        }
    return Capability.model_validate(spec)


def new_reconciler(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    http: httpx.AsyncClient,
    **options: Any,
) -> Reconciler:
    return Reconciler(
        sessions,
        registry,
        http,
        topics=DEFAULT_TOPICS,
        **options,
    )


async def unknown_call(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    http: httpx.AsyncClient,
    sandbox_url: str,
    cap_id: str,
    key: str,
    fault: dict[str, Any],
    call_input: dict[str, Any] | None = None,
) -> str:
    """A call the real worker path left in ``result_unknown`` because of ``fault``
    (applied to the first request with ``key`` only), made due at once."""
    await add_fault(sandbox_url, {**fault, "idempotencyKey": key, "method": "POST", "times": 1})
    call = await submit_call(sessions, registry, cap_id, call_input or {"n": 1}, key=key)
    executor = Executor(
        sessions,
        registry,
        ProviderClient(http),
        worker_id="worker-a",
        topics=Topics(events="events"),
    )
    status = await executor.execute(call)
    assert status is not None and status.value == "result_unknown", status
    await make_due(sessions)
    return call


async def make_due(sessions: async_sessionmaker[AsyncSession]) -> None:
    """Every call waiting for the reconciler is due now (no waiting out backoffs)."""
    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls)
            .where(
                tool_calls.c.reconciliation_status == "pending",
                tool_calls.c.lease_owner.is_(None),
            )
            .values(next_reconcile_at=text("now() - interval '1 second'"))
        )


async def age_calls(sessions: async_sessionmaker[AsyncSession], seconds: float) -> None:
    """Pretend every call was dispatched ``seconds`` ago."""
    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls).values(
                dispatched_at=func.now() - func.make_interval(0, 0, 0, 0, 0, 0, seconds),
                created_at=func.now() - func.make_interval(0, 0, 0, 0, 0, 0, seconds),
            )
        )


async def until_settled(reconciler: Reconciler, passes: int = 20) -> Tally:
    """Passes until nothing is left to do (backoffs made due at once)."""
    tally = Tally()
    for _ in range(passes):
        one = await reconciler.run_pass()
        tally.merge(one)
        if one.total == 0:
            return tally
        await make_due(reconciler._sessions)
    raise AssertionError(f"still not settled after {passes} passes: {tally.counts}")


async def events_of(
    sessions: async_sessionmaker[AsyncSession], tool_call_id: str
) -> list[dict[str, Any]]:
    async with sessions() as session:
        rows = await session.execute(
            select(execution_events)
            .where(execution_events.c.tool_call_id == tool_call_id)
            .order_by(execution_events.c.seq)
        )
        return [dict(r._mapping) for r in rows]


async def escalation_rows(sessions: async_sessionmaker[AsyncSession]) -> list[dict[str, Any]]:
    async with sessions() as session:
        rows = await session.execute(select(escalations).order_by(escalations.c.created_at))
        return [dict(r._mapping) for r in rows]


async def escalation_messages(sessions: async_sessionmaker[AsyncSession]) -> list[dict[str, Any]]:
    async with sessions() as session:
        rows = await session.execute(
            select(outbox).where(outbox.c.topic == DEFAULT_TOPICS.escalations).order_by(outbox.c.id)
        )
        return [dict(r._mapping) for r in rows]


async def insert_unknown_calls(
    sessions: async_sessionmaker[AsyncSession],
    keys: list[str],
    cap_id: str,
    *,
    external_ids: dict[str, str] | None = None,
) -> list[str]:
    """Bulk ``result_unknown`` rows (as the recovery sweep or a worker leaves them),
    due now; returns their ids."""
    ids = [f"tc-{uuid.uuid4().hex}" for _ in keys]
    rows = [
        {
            "tool_call_id": call_id,
            "tenant": "acme",
            "run_id": f"run-{i % 50}",
            "capability_id": cap_id,
            "input": {"n": i},
            "idempotency_key": key,
            "request_fingerprint": "bulk",
            "status": "result_unknown",
            "verification_status": "pending",
            "reconciliation_status": "pending",
            "external_request_id": (external_ids or {}).get(key),
            "dispatch_attempts": 1,
            "dispatched_at": func.now(),
            "next_reconcile_at": text("now() - interval '1 second'"),
            "last_error": "sent, no answer: ReadTimeout",
        }
        for i, (call_id, key) in enumerate(zip(ids, keys, strict=True))
    ]
    async with sessions() as session, session.begin():
        for start in range(0, len(rows), 1000):
            await session.execute(insert(tool_calls).values(rows[start : start + 1000]))
    return ids


async def create_at_sandbox(base_url: str, keys: list[str]) -> dict[str, str]:
    """Apply one request per key at the sandbox; returns key -> externalRequestId."""
    found: dict[str, str] = {}
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(base_url=base_url, limits=limits) as client:
        for start in range(0, len(keys), 200):
            chunk = keys[start : start + 200]
            replies = await asyncio.gather(
                *(
                    client.post("/v1/requests", json={"n": k}, headers={"Idempotency-Key": k})
                    for k in chunk
                )
            )
            for key, reply in zip(chunk, replies, strict=True):
                found[key] = json.loads(reply.content)["externalRequestId"]
    return found
