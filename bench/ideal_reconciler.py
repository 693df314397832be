"""A minimal ideal reconciler: the least a reconciler can do to settle ``result_unknown``
calls, the baseline bench.reconcile compares tool-dispatcher's reconciler with.

Per batch of up to 500 due calls: ONE claiming statement (the due calls locked with
``FOR UPDATE SKIP LOCKED`` and stamped with its lease and a bumped version, RETURNING
what the lookups need), every lookup by idempotency key sent with aiohttp at 64 in
flight, ONE fenced ``UPDATE ... FROM unnest(...)`` settling every call found succeeded
(``-> confirmed``) at the version the claim left. Batches until none is due. No events
and no outbox rows: that is what makes it ideal. Several batches can be in flight, each on
its own connection (the claims skip each other's locked rows), as the product's
reconciler keeps several.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import aiohttp
import psycopg

CLAIM = """
WITH due AS (
    SELECT tenant, tool_call_id FROM tool_calls
     WHERE reconciliation_status = 'pending' AND status IN ('result_unknown', 'accepted')
       AND next_reconcile_at <= now()
     ORDER BY next_reconcile_at LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED)
UPDATE tool_calls t
   SET lease_owner = %(owner)s, lease_expires_at = now() + interval '60 seconds',
       next_reconcile_at = now() + interval '60 seconds', version = t.version + 1
  FROM due
 WHERE t.tenant = due.tenant AND t.tool_call_id = due.tool_call_id
RETURNING t.tenant, t.tool_call_id, t.idempotency_key, t.version
"""

# Fenced by the claim's version: the claim bumped it, and so would any later claim of
# the call, so a call taken over is left alone (a lease owner condition would add
# nothing to the fence). The keys are also index conditions on the primary key, as the
# product's moves have them (dispatcher.ledger.transitions.keys_of). With the owner in
# the condition, statistics that saw no claimed row made the planner compare every call
# in doubt with every call of the batch: 73-143 ms for 500 calls behind 3,000, against
# 8 ms without (EXPLAIN ANALYZE, 2026-12-06).
SETTLE = """
UPDATE tool_calls t
   SET status = 'confirmed', verification_status = 'confirmed_success',
       reconciliation_status = 'settled', result = o.result::jsonb,
       external_request_id = o.ext, completed_at = now(),
       reconcile_attempts = t.reconcile_attempts + 1, lease_owner = NULL,
       lease_expires_at = NULL, next_reconcile_at = NULL, version = t.version + 1,
       updated_at = now()
  FROM unnest(%(tenants)s::text[], %(ids)s::text[], %(versions)s::int[],
              %(results)s::text[], %(exts)s::text[])
       AS o(tenant, tool_call_id, version, result, ext)
 WHERE t.tenant = ANY(%(tenant_set)s::text[]) AND t.tool_call_id = ANY(%(ids)s::text[])
   AND t.tenant = o.tenant AND t.tool_call_id = o.tool_call_id
   AND t.status = 'result_unknown' AND t.version = o.version
"""


async def _lookup(http: aiohttp.ClientSession, url: str, key: str) -> dict[str, Any] | None:
    """The provider's record of ``key``, or None (not found, no answer)."""
    try:
        async with http.get(url, params={"idempotencyKey": key}) as response:
            if response.status != 200:
                return None
            found: dict[str, Any] = await response.json(content_type=None)
            return found
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def _settle_batches(
    conn: psycopg.AsyncConnection[Any], http: aiohttp.ClientSession, lookup_url: str, batch: int
) -> int:
    """Batch after batch on one connection until none is due; returns calls settled."""
    settled = 0
    owner = "ideal-reconciler"
    while True:
        claimed = await (await conn.execute(CLAIM, {"owner": owner, "limit": batch})).fetchall()
        if not claimed:
            return settled
        found = await asyncio.gather(*(_lookup(http, lookup_url, c[2]) for c in claimed))
        done = [
            (c, f)
            for c, f in zip(claimed, found, strict=True)
            if f is not None and f.get("status") == "succeeded"
        ]
        cursor = await conn.execute(
            SETTLE,
            {
                "tenants": [c[0] for c, _ in done],
                "tenant_set": sorted({c[0] for c, _ in done}),
                "ids": [c[1] for c, _ in done],
                "versions": [c[3] for c, _ in done],
                "results": [json.dumps(f.get("result")) for _, f in done],
                "exts": [f.get("externalRequestId") for _, f in done],
            },
        )
        settled += cursor.rowcount


async def settle_all(
    conns: Sequence[psycopg.AsyncConnection[Any]],
    lookup_url: str,
    *,
    batch: int = 500,
    in_flight: int = 64,
) -> int:
    """Settle every due call found succeeded at ``lookup_url``, one batch in flight per
    connection of ``conns`` (autocommit; the caller's, so that their server processes
    outlive the measurement), ``in_flight`` lookups at once in all; returns how many."""
    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(5.0)
    ) as http:
        counts = await asyncio.gather(
            *(_settle_batches(conn, http, lookup_url, batch) for conn in conns)
        )
    return sum(counts)
