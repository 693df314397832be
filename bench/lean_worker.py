"""A lean ideal worker: only the work at-most-once dispatch cannot do without, on a
table of its own with only the columns that work needs (``lean_calls``: id, status,
key, lease, outcome), the second ceiling of bench.dispatch.

    .venv/bin/python -m bench.lean_worker --database-url URL \
        --url http://127.0.0.1:PORT/v1/requests

Per batch of up to 500 calls: ONE claiming UPDATE (``authorized -> dispatching`` under
a lease, ``FOR UPDATE SKIP LOCKED``), every request POSTed with aiohttp at 64 in
flight with the call's key (Idempotency-Key), ONE fenced UPDATE recording every
outcome. No broker, no events, no outbox, no wide rows or secondary indexes: what the
project's table and its facts cost is the gap between this ceiling and
bench.ideal_worker's. It runs on uvloop until SIGTERM or SIGINT, in its own process so
that its CPU is measured like a worker's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

import aiohttp
import psycopg
import uvloop

from kit.heap import prepare_service_heap
from kit.signals import until_signal

TABLE = """
CREATE TABLE IF NOT EXISTS lean_calls (
    id bigint PRIMARY KEY,
    status text NOT NULL,
    key text NOT NULL,
    lease_owner text,
    lease_expires_at timestamptz,
    dispatched_at timestamptz,
    completed_at timestamptz,
    outcome text
)
"""
# The claim's index: the calls waiting, in id order (a partial index, like the
# project's, so finished calls cost it nothing).
INDEX = (
    "CREATE INDEX IF NOT EXISTS lean_calls_waiting ON lean_calls (id) WHERE status = 'authorized'"
)

CLAIM = """
UPDATE lean_calls c
   SET status = 'dispatching', lease_owner = %(owner)s,
       lease_expires_at = now() + interval '30 seconds', dispatched_at = now()
 WHERE c.id IN (SELECT id FROM lean_calls WHERE status = 'authorized'
                ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
RETURNING c.id, c.key
"""

RECORD = """
UPDATE lean_calls c
   SET status = o.status, outcome = o.outcome, completed_at = now(),
       lease_owner = NULL, lease_expires_at = NULL
  FROM unnest(%(ids)s::bigint[], %(statuses)s::text[], %(outcomes)s::text[])
       AS o(id, status, outcome)
 WHERE c.id = o.id AND c.status = 'dispatching' AND c.lease_owner = %(owner)s
"""


async def _post(http: aiohttp.ClientSession, url: str, key: str) -> tuple[str, str | None]:
    try:
        async with http.post(url, json={"to": key}, headers={"Idempotency-Key": key}) as reply:
            answer = await reply.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return "result_unknown", type(exc).__name__
    if reply.status == 200 and answer.get("status") == "succeeded":
        return "completed", answer.get("externalRequestId") or answer.get("id")
    return "result_unknown", f"HTTP {reply.status}"


async def _work(args: argparse.Namespace, stop: asyncio.Event) -> None:
    owner = f"lean:{os.getpid()}"
    connector = aiohttp.TCPConnector(limit=args.in_flight)
    timeout = aiohttp.ClientTimeout(total=5.0)
    async with (
        await psycopg.AsyncConnection.connect(args.database_url, autocommit=True) as conn,
        aiohttp.ClientSession(connector=connector, timeout=timeout) as http,
    ):
        while not stop.is_set():
            claimed: list[Any] = await (
                await conn.execute(CLAIM, {"owner": owner, "batch": args.batch})
            ).fetchall()
            if not claimed:
                await asyncio.sleep(0.05)
                continue
            outcomes = await asyncio.gather(*(_post(http, args.url, key) for _, key in claimed))
            await conn.execute(
                RECORD,
                {
                    "owner": owner,
                    "ids": [c[0] for c in claimed],
                    "statuses": [o[0] for o in outcomes],
                    "outcomes": [o[1] for o in outcomes],
                },
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lean_worker", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--url", required=True, help="the sandbox's POST endpoint")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--in-flight", type=int, default=64)
    args = parser.parse_args()
    # The collector tuned as in every service process of the product (kit.heap).
    prepare_service_heap()
    uvloop.run(until_signal(lambda stop: _work(args, stop)))


if __name__ == "__main__":
    main()
