"""Helpers for worker tests: a registry pointing at a sandbox, calls submitted through
the real intake, and the sandbox's own books read over HTTP."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import Capability, CapabilityRegistry
from dispatcher.db.tables import execution_events, outbox, tool_calls
from dispatcher.intake.service import submit
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import Topics


def capability(
    cap_id: str,
    base_url: str,
    *,
    side_effects: bool = True,
    timeout: float = 2.0,
    attempts: int = 3,
    path: str = "/v1/requests",
) -> Capability:
    return Capability.model_validate(
        {
            "id": cap_id,
            "sideEffects": side_effects,
            "request": {"method": "POST", "url": base_url + path, "timeoutSeconds": timeout},
            "statusLookup": {"method": "GET", "url": base_url + "/v1/requests/{externalRequestId}"},
            "retry": {
                "maxAttempts": attempts,
                "initialBackoffSeconds": 0.01,
                "maxBackoffSeconds": 0.05,
            },
        }
    )


def registry_of(*capabilities: Capability) -> CapabilityRegistry:
    return CapabilityRegistry({c.id: c for c in capabilities})


async def submit_call(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    cap_id: str,
    call_input: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    run_id: str = "run-1",
    topics: dict[str, str] | None = None,
) -> str:
    async with sessions() as session, session.begin():
        submission = await submit(
            session,
            SubmitRequest(
                run_id=run_id, capability_id=cap_id, input=call_input or {}, idempotency_key=key
            ),
            tenant="acme",
            registry=registry,
            topics=Topics(**(topics or {})),
        )
    return submission.view.tool_call_id


async def call_row(sessions: async_sessionmaker[AsyncSession], tool_call_id: str) -> Any:
    async with sessions() as session:
        row = (
            await session.execute(
                select(tool_calls).where(tool_calls.c.tool_call_id == tool_call_id)
            )
        ).one()
    return row._mapping


async def event_types(sessions: async_sessionmaker[AsyncSession], tool_call_id: str) -> list[str]:
    async with sessions() as session:
        rows = await session.execute(
            select(execution_events.c.event_type)
            .where(execution_events.c.tool_call_id == tool_call_id)
            .order_by(execution_events.c.seq)
        )
        return [r[0] for r in rows]


async def event_payloads(
    sessions: async_sessionmaker[AsyncSession], tool_call_id: str
) -> list[dict[str, Any]]:
    async with sessions() as session:
        rows = await session.execute(
            select(execution_events.c.payload)
            .where(execution_events.c.tool_call_id == tool_call_id)
            .order_by(execution_events.c.seq)
        )
        return [r[0] for r in rows]


async def outbox_rows(sessions: async_sessionmaker[AsyncSession], topic: str) -> list[Any]:
    async with sessions() as session:
        rows = await session.execute(
            select(outbox).where(outbox.c.topic == topic).order_by(outbox.c.id)
        )
        return [r._mapping for r in rows]


async def books(base_url: str) -> dict[str, Any]:
    """The sandbox's counts: effects, reversals and requests received, per key."""
    async with httpx.AsyncClient(base_url=base_url) as client:
        data: dict[str, Any] = (await client.get("/v1/effects")).json()
    return data


async def add_fault(base_url: str, rule: dict[str, Any] | list[dict[str, Any]]) -> None:
    async with httpx.AsyncClient(base_url=base_url) as client:
        response = await client.post("/v1/faults", json=rule)
        response.raise_for_status()
