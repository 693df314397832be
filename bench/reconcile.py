"""Benchmark of the reconciler, next to the sandbox's own lookup rate in the same run.

    .venv/bin/python -m bench.reconcile [--database-url URL] [--calls 10000]
        [--batch-size 500] [--concurrency 8] [--batches-in-flight 3]

Starts the sandbox provider in a subprocess, applies one request per key there, and
inserts as many ``result_unknown`` calls (no provider id: each is found by its
idempotency key, as after a lost response). Then it measures:

- the ceiling: raw keep-alive GET lookups against the same sandbox (bench.sandbox's
  client), requests per second;
- the reconciler: calls settled per second until every one is ``confirmed``.

It creates (and drops) its own scratch database on the server named by --database-url.
Target: the reconciler at 0.5x of the lookup rate or better.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid

import httpx
import psycopg
import uvloop
from sqlalchemy import func, insert, select, text

from bench.sandbox import _connection
from dispatcher.db import migrate
from dispatcher.db.engine import engine_for, session_factory
from dispatcher.db.tables import tool_calls
from dispatcher.settings import Topics
from dispatcher.testing.databases import create_database, drop_database, unique_name
from dispatcher.testing.embedded import free_port
from dispatcher.testing.registries import capability, registry_of
from reconciler import Reconciler


async def _apply_at_sandbox(base: str, keys: list[str]) -> None:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        for start in range(0, len(keys), 500):
            replies = await asyncio.gather(
                *(
                    client.post("/v1/requests", json={"n": k}, headers={"Idempotency-Key": k})
                    for k in keys[start : start + 500]
                )
            )
            assert all(r.status_code == 200 for r in replies)


async def _lookup_rate(host: str, port: int, seconds: float, connections: int) -> float:
    latencies: list[float] = []
    started = time.perf_counter()
    counts = await asyncio.gather(
        *(
            _connection(host, port, "lookup", started + seconds, latencies)
            for _ in range(connections)
        )
    )
    return sum(counts) / (time.perf_counter() - started)


async def run(args: argparse.Namespace, url: str) -> None:
    host, port = "127.0.0.1", free_port()
    base = f"http://{host}:{port}"
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dispatcher.testing.sandbox",
        "--port",
        str(port),
        stdout=asyncio.subprocess.PIPE,
    )
    engine = engine_for(url, pool_size=10)
    sessions = session_factory(engine)
    try:
        assert server.stdout is not None
        print((await asyncio.wait_for(server.stdout.readline(), 30)).decode().strip())
        keys = [f"rc:{i}" for i in range(args.calls)]
        # bench.sandbox's lookup client asks for keys warm:0..99.
        await _apply_at_sandbox(base, keys + [f"warm:{i}" for i in range(100)])
        async with sessions() as session, session.begin():
            for start in range(0, len(keys), 1000):
                await session.execute(
                    insert(tool_calls).values(
                        [
                            {
                                "tool_call_id": f"tc-{uuid.uuid4().hex}",
                                "tenant": "bench",
                                "run_id": f"run-{i % 100}",
                                "capability_id": "refund",
                                "input": {"n": key},
                                "idempotency_key": key,
                                "request_fingerprint": "bench",
                                "status": "result_unknown",
                                "verification_status": "pending",
                                "reconciliation_status": "pending",
                                "dispatch_attempts": 1,
                                "dispatched_at": func.now(),
                                "next_reconcile_at": text("now() - interval '1 second'"),
                            }
                            for i, key in enumerate(keys[start : start + 1000], start)
                        ]
                    )
                )
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("VACUUM ANALYZE tool_calls")

        ceiling = await _lookup_rate(host, port, args.seconds, args.connections)
        print(
            f"sandbox lookups (raw keep-alive GET, {args.connections} connections): "
            f"{ceiling:,.0f} req/s"
        )

        limits = httpx.Limits(
            max_connections=args.concurrency, max_keepalive_connections=args.concurrency
        )
        async with httpx.AsyncClient(limits=limits) as http:
            reconciler = Reconciler(
                sessions,
                registry_of(capability("refund", base, timeout=None, attempts=None, by_key=True)),
                http,
                topics=Topics(events="bench.events", escalations="bench.escalations"),
                batch_size=args.batch_size,
                concurrency=args.concurrency,
                batches_in_flight=args.batches_in_flight,
            )
            started = time.perf_counter()
            tally = await reconciler.run_pass()
            elapsed = time.perf_counter() - started
        async with sessions() as session:
            confirmed = (
                await session.execute(
                    select(func.count()).where(tool_calls.c.status == "confirmed")
                )
            ).scalar_one()
        assert confirmed == args.calls, (confirmed, tally.counts)
        rate = confirmed / elapsed
        print(
            f"reconciler (batch {args.batch_size}, {args.concurrency} lookups in flight, "
            f"{args.batches_in_flight} batches in flight): {confirmed} calls settled in "
            f"{elapsed:.2f}s = {rate:,.0f} calls/s"
        )
        print(f"ratio reconciler / sandbox lookups: {rate / ceiling:.2f}x (target >= 0.5x)")
    finally:
        await engine.dispose()
        server.terminate()
        await server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reconcile", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--batches-in-flight", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32, help="raw lookup clients")
    parser.add_argument("--seconds", type=float, default=3.0, help="raw lookup window")
    args = parser.parse_args()
    scratch = unique_name("bench_reconcile")
    url = create_database(args.database_url, scratch)
    try:
        migrate.upgrade(url)
        # The reconciler's CLI runs on uvloop too (reconciler/cli.py).
        uvloop.run(run(args, url))
    finally:
        drop_database(args.database_url, scratch)


if __name__ == "__main__":
    main()
