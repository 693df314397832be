"""Helpers for approval and control tests: API keys with each scope, capabilities
that need approval, and calls put straight into a given state."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import Capability, CapabilityRegistry
from dispatcher.db.tables import approvals, outbox, tool_calls
from dispatcher.settings import ApiKey, hash_api_key

ALICE = "tdk_test_acme_alice"  # submits, reads and approves
BOB = "tdk_test_acme_bob"  # approves and reads
READER = "tdk_test_acme_reader_submitter"  # submits and reads, cannot approve
OPERATOR = "tdk_test_acme_operator"  # operates and reads
GLOBEX = "tdk_test_globex_all"  # every scope, another tenant


def control_keys() -> list[ApiKey]:
    def key(raw: str, tenant: str, scopes: list[Any], name: str) -> ApiKey:
        return ApiKey(sha256=hash_api_key(raw), tenant=tenant, scopes=scopes, name=name)

    return [
        key(ALICE, "acme", ["submit", "read", "approve"], "alice"),
        key(BOB, "acme", ["approve", "read"], "bob"),
        key(READER, "acme", ["submit", "read"], "reader"),
        key(OPERATOR, "acme", ["operate", "read"], "oncall"),
        key(GLOBEX, "globex", ["submit", "read", "approve", "operate"], "globex"),
    ]


def approval_capability(
    cap_id: str, base_url: str = "http://127.0.0.1:9", **options: Any
) -> Capability:
    """A side-effecting capability that needs a human's approval."""
    return Capability.model_validate(
        {
            "id": cap_id,
            "sideEffects": True,
            "requiresApproval": True,
            "risk": "high",
            "request": {"method": "POST", "url": base_url + "/v1/requests"},
            **options,
        }
    )


def plain_capability(
    cap_id: str, base_url: str = "http://127.0.0.1:9", **options: Any
) -> Capability:
    return Capability.model_validate(
        {
            "id": cap_id,
            "sideEffects": True,
            "request": {"method": "POST", "url": base_url + "/v1/requests"},
            **options,
        }
    )


def with_capability(registry: CapabilityRegistry, capability: Capability) -> CapabilityRegistry:
    """A copy of ``registry`` where ``capability`` replaces the one of its id."""
    return CapabilityRegistry({**{c.id: c for c in registry}, capability.id: capability})


def without_capability(registry: CapabilityRegistry, cap_id: str) -> CapabilityRegistry:
    return CapabilityRegistry({c.id: c for c in registry if c.id != cap_id})


async def insert_call(
    sessions: async_sessionmaker[AsyncSession],
    status: str,
    *,
    cap_id: str = "send",
    run_id: str = "run-1",
    tenant: str = "acme",
    **values: Any,
) -> str:
    """One call in ``status``, as the machinery would have left it."""
    call_id = f"tc-{uuid.uuid4().hex[:12]}"
    row = {
        "tool_call_id": call_id,
        "tenant": tenant,
        "run_id": run_id,
        "capability_id": cap_id,
        "input": {"n": 1},
        "idempotency_key": f"key-{call_id}",
        "request_fingerprint": "direct",
        "status": status,
        **values,
    }
    async with sessions() as session, session.begin():
        await session.execute(insert(tool_calls).values(row))
    return call_id


async def approval_of(sessions: async_sessionmaker[AsyncSession], tool_call_id: str) -> Any:
    async with sessions() as session:
        row = (
            await session.execute(select(approvals).where(approvals.c.tool_call_id == tool_call_id))
        ).one()
    return row._mapping


async def dispatch_commands(sessions: async_sessionmaker[AsyncSession], tool_call_id: str) -> int:
    async with sessions() as session:
        return int(
            (
                await session.execute(
                    select(func.count()).where(
                        outbox.c.topic == "tool-dispatcher.commands",
                        outbox.c.key == tool_call_id,
                    )
                )
            ).scalar_one()
        )
