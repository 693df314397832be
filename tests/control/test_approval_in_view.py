"""A call that needs approval carries it in its view: the 201,
a replay, GET and the HTTP client all show ``approval: {approvalId, status,
expiresAt}``, read from the approvals table, and a decision shows up there."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.client import DispatcherClient
from tests.fixtures.api import ALICE, BOB, GLOBEX, bearer
from tests.fixtures.capabilities import approval_capability, plain_capability
from tests.fixtures.rows import approval_of

pytestmark = pytest.mark.postgres


@pytest.fixture
def registry() -> CapabilityRegistry:
    caps = [approval_capability("refund-big"), plain_capability("send")]
    return CapabilityRegistry({c.id: c for c in caps})


def body(cap: str, key: str) -> dict[str, Any]:
    return {
        "runId": "run-1",
        "capabilityId": cap,
        "input": {"orderId": "o-1"},
        "idempotencyKey": key,
    }


async def test_the_view_of_a_call_needing_approval_carries_it(
    api: httpx.AsyncClient, api_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    created = await api.post("/v1/tool-calls", json=body("refund-big", "k1"), headers=bearer(ALICE))
    assert created.status_code == 201, created.text
    view = created.json()
    recorded = await approval_of(sessions, view["toolCallId"])
    approval = view["approval"]
    assert approval == {
        "approvalId": recorded["approval_id"],
        "status": "pending",
        "expiresAt": approval["expiresAt"],
    }
    assert datetime.fromisoformat(approval["expiresAt"]) == recorded["expires_at"]

    path = f"/v1/tool-calls/{view['toolCallId']}"
    assert (await api.get(path, headers=bearer(ALICE))).json()["approval"] == approval
    replayed = await api.post(
        "/v1/tool-calls", json=body("refund-big", "k1"), headers=bearer(ALICE)
    )
    assert replayed.status_code == 200, replayed.text
    assert replayed.json()["approval"] == approval

    decided = await api.post(
        f"/v1/approvals/{approval['approvalId']}/decision",
        json={"decision": "reject", "reason": "no"},
        headers=bearer(BOB),
    )
    assert decided.status_code == 200, decided.text
    after = (await api.get(path, headers=bearer(ALICE))).json()
    assert after["approval"] == {**approval, "status": "rejected"}

    async with DispatcherClient(api_url, ALICE) as client:
        parsed = await client.get(view["toolCallId"])
    assert parsed.approval is not None
    assert parsed.approval.approval_id == approval["approvalId"]
    assert parsed.approval.status == "rejected"


async def test_a_call_without_approval_has_none(api: httpx.AsyncClient) -> None:
    created = await api.post("/v1/tool-calls", json=body("send", "k2"), headers=bearer(GLOBEX))
    assert created.status_code == 201, created.text
    assert created.json()["approval"] is None
    path = f"/v1/tool-calls/{created.json()['toolCallId']}"
    assert (await api.get(path, headers=bearer(GLOBEX))).json()["approval"] is None
