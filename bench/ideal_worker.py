"""A minimal ideal worker: the least a worker can do per call and still be at most
once, the baseline bench.dispatch compares tool-dispatcher's worker with.

    .venv/bin/python -m bench.ideal_worker --database-url URL --bootstrap HOST:PORT \
        --topic T --group G --url http://127.0.0.1:PORT/v1/requests

Per batch of up to 500 dispatch commands from Kafka: ONE claiming UPDATE (``authorized
-> dispatching`` of the batch's calls, RETURNING what the requests need), every
request POSTed with aiohttp at 64 in flight (Idempotency-Key, traceparent), ONE fenced
``UPDATE ... FROM unnest(...)`` recording every outcome, then the offsets committed.
No events and no outbox rows: that is what makes it ideal, and why it is not the
product. It runs until SIGTERM or SIGINT, in its own process so that its CPU is
measured like a worker's.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
from typing import Any

import aiohttp
import psycopg
import uvloop
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import OffsetAndMetadata

from kit.heap import prepare_service_heap
from kit.signals import until_signal

CLAIM = """
UPDATE tool_calls t
   SET status = 'dispatching', lease_owner = %(owner)s,
       lease_expires_at = now() + interval '30 seconds', dispatched_at = now(),
       dispatch_attempts = t.dispatch_attempts + 1, version = t.version + 1,
       updated_at = now()
  FROM unnest(%(tenants)s::text[], %(ids)s::text[]) AS b(tenant, tool_call_id)
 WHERE t.tenant = b.tenant AND t.tool_call_id = b.tool_call_id
   AND t.status = 'authorized'
RETURNING t.tenant, t.tool_call_id, t.idempotency_key, t.input, t.correlation_id, t.version
"""

# Fenced by the claim: still dispatching, at the version the claim returned, ours.
RECORD = """
UPDATE tool_calls t
   SET status = o.status, result = o.result::jsonb, external_request_id = o.ext,
       last_error = o.error, completed_at = now(),
       verification_status = CASE WHEN o.status = 'completed' THEN 'confirmed_success'
                                  ELSE 'pending' END,
       reconciliation_status = CASE WHEN o.status = 'completed' THEN 'not_needed'
                                    ELSE 'pending' END,
       lease_owner = NULL, lease_expires_at = NULL, version = t.version + 1,
       updated_at = now()
  FROM unnest(%(tenants)s::text[], %(ids)s::text[], %(versions)s::int[],
              %(statuses)s::text[], %(results)s::text[], %(exts)s::text[],
              %(errors)s::text[]) AS o(tenant, tool_call_id, version, status, result, ext, error)
 WHERE t.tenant = o.tenant AND t.tool_call_id = o.tool_call_id
   AND t.status = 'dispatching' AND t.version = o.version AND t.lease_owner = %(owner)s
"""


def traceparent(seed: str) -> str:
    digest = hashlib.sha256(seed.encode()).hexdigest()
    return f"00-{digest[:32]}-{digest[32:48]}-01"


async def _post(http: aiohttp.ClientSession, url: str, call: tuple[Any, ...]) -> tuple[Any, ...]:
    """(status, result JSON, external id, error) of one call."""
    _tenant, tool_call_id, key, body, correlation_id, _version = call
    headers = {
        "Idempotency-Key": key,
        "traceparent": traceparent(correlation_id or tool_call_id),
        "X-Tool-Call-Id": tool_call_id,
    }
    try:
        async with http.post(url, json=body, headers=headers) as response:
            answer = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        # Sent, no (readable) answer: in doubt, as the product records it.
        return ("result_unknown", None, None, type(exc).__name__)
    if response.status == 200 and answer.get("status") == "succeeded":
        ext = answer.get("externalRequestId") or answer.get("id")
        return ("completed", json.dumps(answer.get("result")), ext, None)
    return ("result_unknown", None, None, f"HTTP {response.status}")


async def _batch(
    conn: psycopg.AsyncConnection[Any],
    http: aiohttp.ClientSession,
    url: str,
    owner: str,
    commands: list[tuple[str, str]],
) -> None:
    keys = list(dict.fromkeys(commands))
    claimed = await (
        await conn.execute(
            CLAIM,
            {"owner": owner, "tenants": [k[0] for k in keys], "ids": [k[1] for k in keys]},
        )
    ).fetchall()
    if not claimed:
        return
    outcomes = await asyncio.gather(*(_post(http, url, c) for c in claimed))
    await conn.execute(
        RECORD,
        {
            "owner": owner,
            "tenants": [c[0] for c in claimed],
            "ids": [c[1] for c in claimed],
            "versions": [c[5] for c in claimed],
            "statuses": [o[0] for o in outcomes],
            "results": [o[1] for o in outcomes],
            "exts": [o[2] for o in outcomes],
            "errors": [o[3] for o in outcomes],
        },
    )


def _command(value: bytes) -> tuple[str, str] | None:
    try:
        payload = json.loads(value)
        return (payload["tenant"], payload["toolCallId"])
    except (ValueError, KeyError, TypeError):
        return None


async def run(args: argparse.Namespace) -> None:
    await until_signal(lambda stop: _consume(args, stop))


async def _consume(args: argparse.Namespace, stop: asyncio.Event) -> None:
    owner = f"ideal:{os.getpid()}"
    consumer = AIOKafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=args.batch,
    )
    connector = aiohttp.TCPConnector(limit=args.in_flight)
    timeout = aiohttp.ClientTimeout(total=5.0)
    async with (
        await psycopg.AsyncConnection.connect(args.database_url, autocommit=True) as conn,
        aiohttp.ClientSession(connector=connector, timeout=timeout) as http,
    ):
        await consumer.start()
        try:
            while not stop.is_set():
                fetched = await consumer.getmany(timeout_ms=200, max_records=args.batch)
                if not fetched:
                    continue
                records = [r for rs in fetched.values() for r in rs]
                commands = [c for c in map(_command, (r.value for r in records)) if c]
                await _batch(conn, http, args.url, owner, commands)
                await consumer.commit(
                    {tp: OffsetAndMetadata(rs[-1].offset + 1, "") for tp, rs in fetched.items()}
                )
        finally:
            await consumer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ideal_worker", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--url", required=True, help="the capability's POST endpoint")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--in-flight", type=int, default=64)
    args = parser.parse_args()
    # Its collector tuned as in every service process of the product (kit.heap), and
    # uvloop, as every long-running process of the product is meant to run on.
    prepare_service_heap()
    uvloop.run(run(args))


if __name__ == "__main__":
    main()
