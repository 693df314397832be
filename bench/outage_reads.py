"""What ``bench.outage`` reads of a drill's database and sandbox once it is over."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
import psycopg

from dispatcher.states import SETTLED_STATES

SETTLED = sorted(s.value for s in SETTLED_STATES)


async def status_counts(url: str) -> Counter[str]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        rows = await (
            await conn.execute("SELECT status, count(*) FROM tool_calls GROUP BY status")
        ).fetchall()
    return Counter({status: int(n) for status, n in rows})


async def failed_span(url: str) -> tuple[float, float] | None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        row = await (
            await conn.execute(
                "SELECT extract(epoch FROM min(created_at) FILTER (WHERE status = 'failed')"
                " - min(created_at)), extract(epoch FROM max(created_at)"
                " FILTER (WHERE status = 'failed') - min(created_at)) FROM tool_calls"
            )
        ).fetchone()
    if row is None or row[0] is None:
        return None
    return float(row[0]), float(row[1])


# Each outcome event names the attempts its dispatch made; all but a success's last one
# failed. Held (dispatching -> authorized) and failed outcomes failed every attempt.
FAILED_ATTEMPTS = """
SELECT coalesce(sum(CASE WHEN event_type IN ('tool.call.completed', 'tool.call.accepted')
                         THEN (payload->>'attempts')::int - 1
                         ELSE (payload->>'attempts')::int END), 0)
FROM execution_events
WHERE payload ? 'attempts' AND payload->'from' ? 'dispatching'
"""


async def failed_attempts(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        row = await (await conn.execute(FAILED_ATTEMPTS)).fetchone()
    return int(row[0]) if row else 0


async def failed_probes(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        row = await (
            await conn.execute(
                "SELECT count(*) FROM capability_events WHERE event_type ="
                " 'capability.breaker_opened' AND reason LIKE '%probe%'"
            )
        ).fetchone()
    return int(row[0]) if row else 0


async def most_effects(sandbox_url: str) -> int:
    async with httpx.AsyncClient(base_url=sandbox_url) as client:
        books = (await client.get("/v1/effects")).json()
    return max(books["effects"].values(), default=0)


async def drained(url: str, submitted: int, within: float) -> float | None:
    """When (``time.monotonic()``) every submitted call was settled (the provider is
    back by now)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        counts = await status_counts(url)
        if sum(counts[s] for s in SETTLED) >= submitted:
            return time.monotonic()
        await asyncio.sleep(0.5)
    return None
