"""The simulated approvers of a chaos run, one a tenant, each through its own API key."""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Mapping

import httpx


async def approve_until(
    clients: Mapping[str, httpx.AsyncClient],
    decided: Counter[str],
    stop: asyncio.Event,
    interval: float = 0.5,
) -> None:
    """Each tenant's approver decides every pending approval its tenant is shown, one in
    five rejected (by the approval's id: the same one whichever pass sees it);
    ``decided`` counts the answers by ``decision:status``."""
    while not stop.is_set():
        for client in clients.values():
            try:
                response = await client.get("/v1/approvals", params={"status": "pending"})
                pending = (
                    response.json().get("approvals", []) if response.status_code == 200 else []
                )
                for approval in pending:
                    decided[await _decide(client, approval["approvalId"])] += 1
            except (httpx.HTTPError, ValueError):
                pass  # the API is down for a fault; the approvals wait
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except TimeoutError:
            pass


async def _decide(client: httpx.AsyncClient, approval_id: str) -> str:
    reject = hashlib.sha256(approval_id.encode()).digest()[0] % 5 == 0
    decision = "reject" if reject else "approve"
    response = await client.post(
        f"/v1/approvals/{approval_id}/decision", json={"decision": decision, "reason": "chaos"}
    )
    return f"{decision}:{response.status_code}"
