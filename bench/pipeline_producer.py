"""``python -m bench.pipeline_producer``: one producer process of ``bench.pipeline``,
open loop: call ``i`` is started at ``i / rate`` seconds whether or not the calls
before it finished (a producer's traffic does not wait for the service), each in a
transaction of its own, and its start, commit and toolCallId are written to ``--out``
as JSON, with the process's own CPU seconds.

``--mode submit``: the library's ``submit()`` in the caller's ``AsyncSession``.
``--mode submit-psycopg``: ``submit()`` on the caller's psycopg connection, from a pool
like the minimal writer's (the library's other documented way in).
``--mode minimal``: a minimal writer, raw psycopg inserting the same three outbox rows
a submission publishes (its two events and its dispatch command) and nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from bench.intake_modes import library_engine
from bench.intake_rows import CAPABILITY, INPUT, TENANT
from devtools.registries import sandbox_registry
from dispatcher.db.engine import session_factory
from dispatcher.intake.service import submit
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import DEFAULT_TOPICS
from kit.heap import prepare_service_heap

POOL = 32


def submitter(url: str) -> tuple[Callable[[int], Awaitable[str]], Callable[[], Awaitable[None]]]:
    engine = library_engine(url, POOL)
    sessions = session_factory(engine)
    registry = sandbox_registry()

    async def one(i: int) -> str:
        request = SubmitRequest(run_id=f"run-{i % 100}", capability_id=CAPABILITY, input=INPUT)
        async with sessions() as session, session.begin():
            done = await submit(session, request, tenant=TENANT, registry=registry)
        return done.view.tool_call_id

    return one, engine.dispose


def psycopg_submitter(
    url: str,
) -> tuple[Callable[[int], Awaitable[str]], Callable[[], Awaitable[None]]]:
    pool = AsyncConnectionPool(url, min_size=POOL, max_size=POOL, open=False)
    registry = sandbox_registry()
    opened = asyncio.Event()

    async def one(i: int) -> str:
        if not opened.is_set():
            await pool.open(wait=True)
            opened.set()
        request = SubmitRequest(run_id=f"run-{i % 100}", capability_id=CAPABILITY, input=INPUT)
        async with pool.connection() as conn:  # commits on exit
            done = await submit(conn, request, tenant=TENANT, registry=registry)
        return done.view.tool_call_id

    return one, pool.close


def minimal_writer(
    url: str,
) -> tuple[Callable[[int], Awaitable[str]], Callable[[], Awaitable[None]]]:
    pool = AsyncConnectionPool(url, min_size=POOL, max_size=POOL, open=False)
    topics = DEFAULT_TOPICS
    opened = asyncio.Event()

    async def one(i: int) -> str:
        if not opened.is_set():
            await pool.open(wait=True)
            opened.set()
        call = str(uuid.uuid4())
        key = f"{TENANT}/run-{i % 100}"
        rows = [
            (topics.events, key, {"eventType": "tool.call.requested", "toolCallId": call}),
            (topics.events, key, {"eventType": "tool.call.authorized", "toolCallId": call}),
            (topics.dispatch, f"{TENANT}/{call}", {"toolCallId": call, "input": INPUT}),
        ]
        async with pool.connection() as conn:  # commits on exit
            async with conn.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO outbox (topic, key, payload, headers) VALUES (%s, %s, %s, %s)",
                    [
                        (topic, k, Jsonb(p), Jsonb({"ce_id": str(uuid.uuid4())}))
                        for topic, k, p in rows
                    ],
                )
        return call

    async def close() -> None:
        await pool.close()

    return one, close


async def run(url: str, mode: str, rate: float, seconds: float) -> dict[str, Any]:
    writers = {"submit": submitter, "submit-psycopg": psycopg_submitter}
    one, close = writers.get(mode, minimal_writer)(url)
    # Warm, as a producer that has been running is: the pool open, then every one of
    # its connections used once at the same time (each backend's caches, each prepared
    # statement). With one connection warmed, the first second's calls paid for the
    # others, and the run's p99 was the cold start's.
    await one(-1)
    await asyncio.gather(*(one(-2 - k) for k in range(POOL)))
    total = round(rate * seconds)
    calls: list[list[Any]] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    wall = time.time() - (loop.time() - start)

    async def timed(i: int) -> None:
        scheduled = wall + i / rate
        call = await one(i)
        calls.append([call, scheduled, time.time()])

    cpu = time.process_time()
    tasks = []
    for i in range(total):
        await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
        tasks.append(asyncio.create_task(timed(i)))
    await asyncio.gather(*tasks)
    used = time.process_time() - cpu
    await close()
    return {"calls": calls, "cpuSeconds": used}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline_producer")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--mode", choices=("submit", "submit-psycopg", "minimal"), required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--frozen-heap", action="store_true")
    args = parser.parse_args()
    if args.frozen_heap:
        # After the imports, before the loop: what a producer application can do.
        prepare_service_heap()
    # On uvloop, as the service's own processes run (dispatcher.runtime).
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        found = runner.run(run(args.database_url, args.mode, args.rate, args.seconds))
    args.out.write_text(json.dumps(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
