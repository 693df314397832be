"""Intake throughput at 1, 16 and 64 concurrent clients, next to the ceilings of this
machine measured in the same run:

  library  ``dispatcher.intake.service.submit`` in the caller's transaction (SQLAlchemy async,
           psycopg 3, pool size = clients)
  library-psycopg  the same ``submit()`` in a caller's raw psycopg transaction
           (AsyncConnectionPool, the psycopg ceiling's pool): the library for a caller
           without SQLAlchemy
  session  the SQL ``submit()`` sends, captured from it, sent through the caller's
           ``AsyncSession`` (same engine and pool), one transaction per call: the fair
           ceiling of a library call in the caller's transaction (bench.intake_session)
  psycopg-in-session  raw psycopg's rows (below) on the psycopg connection of the
           caller's ``AsyncSession``, one transaction per call: the floor any library
           call in the caller's session stands on
  http     ``POST /v1/tool-calls`` against ``tool-dispatcher serve`` in its own process,
           driven by a minimal raw asyncio HTTP/1.1 keep-alive client in this process
  pgbench  the same rows in one plain transaction (INSERT the call RETURNING *, INSERT
           its 2 events, INSERT its 3 outbox rows, COMMIT) from pgbench, ``-M prepared``
  psycopg  that transaction from raw psycopg 3 (AsyncConnectionPool, no ORM)

Every cell runs on a fresh database copied from a migrated template, so no cell
inherits another's table growth. Run it as::

    .venv/bin/python -m bench.intake [--seconds 6] [--clients 1,16,64] [--rounds 3]
        [--database-url postgresql://postgres@127.0.0.1:5432/postgres]
        [--only library,library-psycopg,session,psycopg-in-session,http,pgbench,psycopg]

With ``--rounds N`` every cell is measured N times, the modes in turn forward and then
backward, and a ratio is the median of the rounds' own ratios: on a shared machine
whose speed drifts by a third within minutes, the two sides of a ratio are then
measured close together and in both orders.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from bench.harness import (
    Call,
    Cell,
    CpuMeter,
    drive,
    machine_busy_seconds,
    postgres_processes,
    render_table,
)
from bench.intake_session import capture, describe, replay_client
from dispatcher.db import migrate
from dispatcher.db.engine import create_engine, session_factory
from dispatcher.intake.keys import fingerprint
from dispatcher.intake.service import submit
from dispatcher.intake.statement import CallerTransaction
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import Settings, hash_api_key
from dispatcher.testing.databases import with_database
from dispatcher.testing.embedded import free_port, wait_for_port
from dispatcher.testing.registries import SANDBOX_REGISTRY, sandbox_registry

ROOT = Path(__file__).resolve().parent.parent
MODES = (
    "library", "library-psycopg", "session", "psycopg-in-session",
    "http", "http-cores", "pgbench", "psycopg",
)  # fmt: skip
TENANT = "bench"
CAPABILITY = "send-email"  # no approval, no key template: one call, two events, one command
INPUT = {"to": "customer@example.com", "subject": "Your refund", "orderId": "o-1001"}
TOPIC = "tool-dispatcher.commands"
EVENTS_TOPIC = "tool-dispatcher.events"
PRODUCER = "tool-dispatcher.intake"
# Targets at 16 clients (issue 15).
TARGETS = {
    "library/session": 0.9,
    "library/psycopg": 0.75,
    "library-psycopg/psycopg": 0.75,
    "http/pgbench": 0.6,
    "http-cores/pgbench": 0.6,
}
TARGET_CLIENTS = 16
# Printed beside the targets, without one. Raw psycopg's own rows written in a caller's
# session (psycopg-in-session) against raw psycopg is the share of raw psycopg's rate
# left to any library call in a caller's AsyncSession: the session's begin, checkout,
# commit and return cost what they cost, whatever the call writes. The library against
# that floor is what the library itself costs beyond raw psycopg's writes.
BOUNDS = {
    "session/psycopg": None,
    "psycopg-in-session/psycopg": None,
    "library/psycopg-in-session": None,
}
NOISY_OTHER_LOAD = 25.0

# --- the rows that intake writes, as plain SQL (psycopg and pgbench) ----------------
#
# One call writes: the tool_calls row (RETURNING *), two execution_events rows
# (requested, authorized) and three outbox rows (both events published on the events
# topic, keyed by run, and the dispatch command, keyed by call). The ceilings write
# exactly these rows in the fewest plain statements: one INSERT per table.

_CALL_COLUMNS = (
    "tool_call_id, tenant, run_id, turn_id, capability_id, input, idempotency_key, "
    "request_fingerprint, status, correlation_id, causation_id, reasoning_object_id"
)
_EVENT_COLUMNS = (
    "event_id, event_type, tenant, run_id, turn_id, producer, reasoning_object_id, "
    "capability_id, correlation_id, causation_id, tool_call_id, schema_version, "
    "occurred_at, payload"
)
PSYCOPG_SQL = (
    f"INSERT INTO tool_calls ({_CALL_COLUMNS}) VALUES "
    "(%s, %s, %s, NULL, %s, %s, %s, %s, 'authorized', NULL, NULL, NULL) "
    "ON CONFLICT DO NOTHING RETURNING *",
    f"INSERT INTO execution_events ({_EVENT_COLUMNS}) VALUES "
    "(%s, 'tool.call.requested', %s, %s, NULL, %s, NULL, %s, NULL, NULL, %s, 1, %s, %s), "
    "(%s, 'tool.call.authorized', %s, %s, NULL, %s, NULL, %s, NULL, %s, %s, 1, %s, %s)",
    "INSERT INTO outbox (topic, key, payload, headers) VALUES "
    "(%s, %s, %s, %s), (%s, %s, %s, %s), (%s, %s, %s, %s)",
)


def event_message(
    event_id: str, event_type: str, run: str, tc: str, causation: str | None, now: str
) -> tuple[str, str, Jsonb, Jsonb]:
    """Outbox values publishing one event (same fields as dispatcher.ledger.events)."""
    body: dict[str, object] = {
        "eventId": event_id,
        "eventType": event_type,
        "tenant": TENANT,
        "runId": run,
        "turnId": None,
        "producer": PRODUCER,
        "reasoningObjectId": None,
        "capabilityId": CAPABILITY,
        "correlationId": None,
        "causationId": causation,
        "toolCallId": tc,
        "schemaVersion": 1,
        "occurredAt": now,
        "payload": {},
    }
    return (EVENTS_TOPIC, run, Jsonb(body), Jsonb(_headers(event_id, event_type, now)))


def _headers(message_id: str, ce_type: str, now: str) -> dict[str, str]:
    return {
        "ce_id": message_id,
        "ce_type": ce_type,
        "ce_source": f"/tool-dispatcher/{PRODUCER}",
        "ce_specversion": "1.0",
        "ce_time": now,
    }


def pgbench_script(input_json: str, fp: str) -> str:
    """The same rows as a pgbench script; ids come from a 63-bit random."""
    tc = "(:id)::text"
    req = "'evt_' || (:id)::text || 'r'"
    auth = "'evt_' || (:id)::text || 'a'"
    run = "'run-' || (:client_id)::text"

    def event(event_id: str, event_type: str, causation: str) -> str:
        body = (
            f"jsonb_build_object('eventId', {event_id}, 'eventType', '{event_type}', "
            f"'tenant', '{TENANT}', 'runId', {run}, 'turnId', NULL, 'producer', '{PRODUCER}', "
            f"'reasoningObjectId', NULL, 'capabilityId', '{CAPABILITY}', "
            f"'correlationId', NULL, 'causationId', {causation}, 'toolCallId', {tc}, "
            f"'schemaVersion', 1, 'occurredAt', now()::text, 'payload', '{{}}'::jsonb)"
        )
        return f"('{EVENTS_TOPIC}', {run}, {body}, {headers(event_id, event_type)})"

    def headers(message_id: str, ce_type: str) -> str:
        return (
            f"jsonb_build_object('ce_id', {message_id}, 'ce_type', '{ce_type}', "
            f"'ce_source', '/tool-dispatcher/{PRODUCER}', 'ce_specversion', '1.0', "
            "'ce_time', now()::text)"
        )

    command = (
        f"jsonb_build_object('toolCallId', {tc}, 'tenant', '{TENANT}', 'runId', {run}, "
        f"'capabilityId', '{CAPABILITY}', 'idempotencyKey', {tc}, 'causationId', {auth})"
    )
    return f"""\\set id random(1, 9000000000000000000)
BEGIN;
INSERT INTO tool_calls ({_CALL_COLUMNS}) VALUES ({tc}, '{TENANT}', {run}, NULL, '{CAPABILITY}',
  '{input_json}'::jsonb, {tc}, '{fp}', 'authorized', NULL, NULL, NULL)
  ON CONFLICT DO NOTHING RETURNING *;
INSERT INTO execution_events ({_EVENT_COLUMNS}) VALUES
  ({req}, 'tool.call.requested', '{TENANT}', {run}, NULL, '{PRODUCER}', NULL,
   '{CAPABILITY}', NULL, NULL, {tc}, 1, now(),
   jsonb_build_object('idempotencyKey', {tc}, 'requiresApproval', false)),
  ({auth}, 'tool.call.authorized', '{TENANT}', {run}, NULL, '{PRODUCER}', NULL,
   '{CAPABILITY}', NULL, {req}, {tc}, 1, now(), '{{"reason": "no approval required"}}'::jsonb);
INSERT INTO outbox (topic, key, payload, headers) VALUES
  {event(req, "tool.call.requested", "NULL")},
  {event(auth, "tool.call.authorized", req)},
  ('{TOPIC}', {tc}, {command}, {headers("gen_random_uuid()::text", "tool.call.dispatch")});
COMMIT;
"""


# --- scratch databases ------------------------------------------------------------


class ScratchDatabases:
    """A migrated template ``td_bench_<hex>`` and one copy of it per cell."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.template = f"td_bench_{secrets.token_hex(4)}"
        self._cells = 0

    def _admin(self, *statements: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def create_template(self) -> None:
        self._admin(f'CREATE DATABASE "{self.template}"')
        migrate.upgrade(with_database(self.admin_url, self.template))

    @contextlib.contextmanager
    def cell(self) -> Iterator[str]:
        self._cells += 1
        name = f"{self.template}_{self._cells}"
        # CHECKPOINT: no cell pays for the previous cell's dirty buffers.
        self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"', "CHECKPOINT")
        try:
            yield with_database(self.admin_url, name)
        finally:
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def drop(self) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')


# --- the four modes ---------------------------------------------------------------


def _meter(url: str, **roles: psutil.Process | list[psutil.Process]) -> CpuMeter:
    """CPU of the given processes (a role may be several) and of the PostgreSQL
    processes serving ``url``."""
    database = make_url(url).database or ""
    groups = {
        name: (lambda p=procs: p if isinstance(p, list) else [p]) for name, procs in roles.items()
    }
    return CpuMeter({**groups, "postgres": lambda: postgres_processes(database)})


def library_engine(url: str, clients: int) -> AsyncEngine:
    # Like the raw psycopg pool it is compared with: no pre-ping round trip per checkout.
    return create_engine(Settings(database_url=url, db_pool_size=clients, db_pool_pre_ping=False))


def library_client(sessions: async_sessionmaker[AsyncSession], run: str) -> Call:
    """One client's call: ``submit()`` in a transaction of its own."""
    intake = _submitter(run)

    async def call() -> None:
        async with sessions() as session, session.begin():
            await intake(session)

    return call


def _submitter(
    run: str,
) -> Callable[[AsyncSession | psycopg.AsyncConnection[Any]], Awaitable[object]]:
    """The library call a client makes, in whichever transaction it is given."""
    registry = sandbox_registry()

    def intake(transaction: AsyncSession | psycopg.AsyncConnection[Any]) -> Awaitable[object]:
        request = SubmitRequest(run_id=run, capability_id=CAPABILITY, input=INPUT)
        return submit(transaction, request, tenant=TENANT, registry=registry)

    return intake


async def run_library(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    engine = library_engine(url, clients)
    sessions = session_factory(engine)
    try:
        return await drive(
            Cell("library", clients),
            [library_client(sessions, f"run-{i}") for i in range(clients)],
            seconds=seconds,
            warmup=warmup,
            cpu=_meter(url, client=psutil.Process()),
        )
    finally:
        await engine.dispose()


def library_psycopg_client(pool: AsyncConnectionPool, run: str) -> Call:
    """One client's call: ``submit()`` in a psycopg transaction of its own."""
    intake = _submitter(run)

    async def call() -> None:
        async with pool.connection() as conn:  # commits on exit
            await intake(conn)

    return call


async def run_library_psycopg(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    return await _on_pool("library-psycopg", library_psycopg_client, url, clients, seconds, warmup)


async def run_session(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    engine = library_engine(url, clients)
    sessions = session_factory(engine)
    try:
        statements = await capture(engine, library_client(sessions, "run-0"))
        print(f"  session: {describe(statements)}", flush=True)
        return await drive(
            Cell("session", clients),
            [replay_client(sessions, statements, {"run-0": f"run-{i}"}) for i in range(clients)],
            seconds=seconds,
            warmup=warmup,
            cpu=_meter(url, client=psutil.Process()),
        )
    finally:
        await engine.dispose()


def raw_rows(run: str) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
    """The same rows as intake writes, in raw psycopg, on the connection it is given
    (in the transaction open there)."""
    call_sql, events_sql, outbox_sql = PSYCOPG_SQL
    fp = fingerprint(CAPABILITY, INPUT)

    async def write(conn: psycopg.AsyncConnection[Any]) -> None:
        tc = str(uuid.uuid4())
        req, auth = f"evt_{uuid.uuid4().hex}", f"evt_{uuid.uuid4().hex}"
        now = datetime.now(UTC)
        iso = now.isoformat()
        command = {
            "toolCallId": tc,
            "tenant": TENANT,
            "runId": run,
            "capabilityId": CAPABILITY,
            "idempotencyKey": tc,
            "causationId": auth,
        }
        cur = await conn.execute(call_sql, (tc, TENANT, run, CAPABILITY, Jsonb(INPUT), tc, fp))
        await cur.fetchone()
        await conn.execute(
            events_sql,
            (
                *(req, TENANT, run, PRODUCER, CAPABILITY, tc, now),
                Jsonb({"idempotencyKey": tc, "requiresApproval": False}),
                *(auth, TENANT, run, PRODUCER, CAPABILITY, req, tc, now),
                Jsonb({"reason": "no approval required"}),
            ),
        )
        await conn.execute(
            outbox_sql,
            (
                *event_message(req, "tool.call.requested", run, tc, None, iso),
                *event_message(auth, "tool.call.authorized", run, tc, req, iso),
                *(TOPIC, tc, Jsonb(command)),
                Jsonb(_headers(str(uuid.uuid4()), "tool.call.dispatch", iso)),
            ),
        )

    return write


def psycopg_client(pool: AsyncConnectionPool, run: str) -> Call:
    """One client's call: the same rows as intake writes, in raw psycopg."""
    write = raw_rows(run)

    async def call() -> None:
        async with pool.connection() as conn:  # commits on exit
            await write(conn)

    return call


def psycopg_in_session_client(sessions: async_sessionmaker[AsyncSession], run: str) -> Call:
    """One client's call: raw psycopg's rows on the psycopg connection of the caller's
    ``AsyncSession``, reached as ``submit()`` reaches it, in a transaction of its own.
    What is left of a call when its writes cost no more than raw psycopg's: the floor
    of any library call made in the caller's session, whatever it writes with."""
    write = raw_rows(run)

    async def call() -> None:
        async with sessions() as session, session.begin():
            await write((await CallerTransaction.of(session)).driver)

    return call


async def run_psycopg_in_session(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    engine = library_engine(url, clients)
    sessions = session_factory(engine)
    try:
        return await drive(
            Cell("psycopg-in-session", clients),
            [psycopg_in_session_client(sessions, f"run-{i}") for i in range(clients)],
            seconds=seconds,
            warmup=warmup,
            cpu=_meter(url, client=psutil.Process()),
        )
    finally:
        await engine.dispose()


async def run_psycopg(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    return await _on_pool("psycopg", psycopg_client, url, clients, seconds, warmup)


async def _on_pool(
    mode: str,
    client: Callable[[AsyncConnectionPool, str], Call],
    url: str,
    clients: int,
    seconds: float,
    warmup: float,
) -> Cell:
    """A cell whose clients share one raw psycopg pool, one connection each."""
    pool = AsyncConnectionPool(url, min_size=clients, max_size=clients, open=False)
    await pool.open(wait=True)
    try:
        return await drive(
            Cell(mode, clients),
            [client(pool, f"run-{i}") for i in range(clients)],
            seconds=seconds,
            warmup=warmup,
            cpu=_meter(url, client=psutil.Process()),
        )
    finally:
        await pool.close()


async def run_pgbench(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    del warmup  # pgbench connects first and times only the transactions
    cell = Cell("pgbench", clients)
    with tempfile.TemporaryDirectory(prefix="td-pgbench-") as tmp:
        script = Path(tmp, "intake.sql")
        await asyncio.to_thread(
            script.write_text, pgbench_script(json.dumps(INPUT), fingerprint(CAPABILITY, INPUT))
        )
        proc = await asyncio.create_subprocess_exec(
            "pgbench", "-n", "-M", "prepared", "-f", str(script),
            "-c", str(clients), "-j", str(min(2, clients)), "-T", str(round(seconds)),
            "-l", "--log-prefix", str(Path(tmp, "log")), url,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        # CPU is sampled inside the run: pgbench's backends are gone once it exits.
        cpu = _meter(url, client=psutil.Process(proc.pid))
        communicate = asyncio.create_task(proc.communicate())
        await asyncio.sleep(0.5)
        cpu.start()
        await asyncio.sleep(max(0.5, round(seconds) - 1.0))
        cell.cpu = cpu.stop()
        out, err = await communicate
        text = out.decode() + err.decode()
        tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", text)
        failed = re.search(r"number of failed transactions: (\d+)", text)
        if proc.returncode != 0 or tps is None:
            cell.note = "pgbench failed: " + " | ".join(text.strip().splitlines()[-3:])
            return cell
        cell.latencies = await asyncio.to_thread(_pgbench_latencies, Path(tmp))
        cell.calls = len(cell.latencies)
        cell.seconds = cell.calls / float(tps.group(1))
        cell.errors = int(failed.group(1)) if failed else 0
    return cell


def _pgbench_latencies(log_dir: Path) -> list[float]:
    """Seconds per transaction from pgbench's per-transaction logs (third column, µs)."""
    return [
        int(line.split()[2]) / 1e6
        for log in log_dir.glob("log.*")
        for line in log.read_text().splitlines()
    ]


class _HttpConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time, responses framed by
    Content-Length (all the API sends). Much cheaper per request than httpx."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0 or self._waiter is None:
            return
        head = bytes(self._buffer[:end]).lower()
        length = re.search(rb"\r\ncontent-length: *(\d+)", head)
        total = end + 4 + (int(length.group(1)) if length else 0)
        if len(self._buffer) < total:
            return
        body = bytes(self._buffer[end + 4 : total])
        del self._buffer[:total]
        waiter, self._waiter = self._waiter, None
        waiter.set_result((int(head[9:12]), body))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("the server closed the connection"))

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        assert self._transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(raw)
        return await self._waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def server_flavour() -> str:
    """The server's event loop (dispatcher.runtime's, which the server inherits through
    this process's environment) and uvicorn's HTTP parser."""
    loop = os.environ.get("TOOL_DISPATCHER_EVENT_LOOP", "uvloop")
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"uvicorn loop={loop} http={http}"


@contextlib.asynccontextmanager
async def api_process(
    url: str, clients: int, key: str, log: Path
) -> AsyncIterator[tuple[int, int]]:
    """``python -m dispatcher serve`` in its own process; yields (port, pid)."""
    port = free_port()
    env = {
        **os.environ,
        "TOOL_DISPATCHER_DATABASE_URL": url,
        "TOOL_DISPATCHER_API_KEYS": json.dumps([{"sha256": hash_api_key(key), "tenant": TENANT}]),
        "TOOL_DISPATCHER_HTTP_HOST": "127.0.0.1",
        "TOOL_DISPATCHER_HTTP_PORT": str(port),
        "TOOL_DISPATCHER_DB_POOL_SIZE": str(max(clients, 2)),
        # `serve` has no default registry; the library modes use this one too.
        "TOOL_DISPATCHER_CAPABILITIES_FILE": str(SANDBOX_REGISTRY),
        # One tenant at full speed is what is measured: its rate limit would cap it.
        "TOOL_DISPATCHER_SUBMIT_RATE_PER_SECOND": "0",
    }
    out = await asyncio.to_thread(log.open, "wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dispatcher", "serve",
        cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        await asyncio.to_thread(wait_for_port, "127.0.0.1", port, 30.0)
        yield port, proc.pid
    finally:
        if proc.returncode is None:
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        out.close()


async def run_http(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    return await _http_cell("http", url, clients, seconds, warmup, processes=1)


async def run_http_per_core(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    """As deployed on this machine: one API process per core (the API is one Python
    process, so it uses one core; PostgreSQL's backends use them all), the clients
    split evenly between them, each kept on one as a load balancer would."""
    cores = psutil.cpu_count() or 1
    return await _http_cell("http-cores", url, clients, seconds, warmup, processes=cores)


async def _http_cell(
    mode: str, url: str, clients: int, seconds: float, warmup: float, *, processes: int
) -> Cell:
    key = "tdk_bench_" + secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="td-http-") as tmp:
        logs = [Path(tmp, f"server-{n}.log") for n in range(processes)]
        async with contextlib.AsyncExitStack() as stack:
            pool = -(-clients // processes)
            servers = [
                await stack.enter_async_context(api_process(url, pool, key, log)) for log in logs
            ]
            loop = asyncio.get_running_loop()
            ports = [servers[i % processes][0] for i in range(clients)]
            conns = [
                (await loop.create_connection(_HttpConnection, "127.0.0.1", port))[1]
                for port in ports
            ]
            procs = [psutil.Process(pid) for _, pid in servers]
            meter = _meter(url, client=psutil.Process(), server=procs)
            try:
                cell = await drive(
                    Cell(mode, clients),
                    [_http_client(i, c, ports[i], key) for i, c in enumerate(conns)],
                    seconds=seconds,
                    warmup=warmup,
                    cpu=meter,
                )
            finally:
                for conn in conns:
                    conn.close()
        if cell.errors or not cell.calls:
            text = "".join(
                [await asyncio.to_thread(log.read_text, errors="replace") for log in logs]
            )
            tail = text.strip().splitlines()[-3:]
            cell.note = (cell.note + " | server: " + " / ".join(tail))[:300]
    return cell


def _http_client(i: int, conn: _HttpConnection, port: int, key: str) -> Call:
    body = json.dumps({"runId": f"run-{i}", "capabilityId": CAPABILITY, "input": INPUT}).encode()
    raw = (
        f"POST /v1/tool-calls HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    async def call() -> None:
        status, answer = await conn.request(raw)
        if status != 201:
            raise RuntimeError(f"HTTP {status}: {answer[:200]!r}")

    return call


RUNNERS = {
    "library": run_library,
    "library-psycopg": run_library_psycopg,
    "session": run_session,
    "http": run_http,
    "http-cores": run_http_per_core,
    "pgbench": run_pgbench,
    "psycopg": run_psycopg,
    "psycopg-in-session": run_psycopg_in_session,
}


# --- report -------------------------------------------------------------------------


def _fmt(value: float, digits: int = 1) -> str:
    return "-" if value != value else f"{value:,.{digits}f}"  # NaN check


def app_cpu_per_call(cell: Cell) -> float:
    """CPU µs per call of the process running the intake code (the bench process for
    library/psycopg, the server for http, PostgreSQL for pgbench). Contention from
    other work on the machine moves it far less than it moves calls/s."""
    role = {"http": "server", "http-cores": "server", "pgbench": "postgres"}.get(
        cell.mode, "client"
    )
    if role not in cell.cpu or not cell.rate:
        return math.nan
    return cell.cpu[role] / 100 / cell.rate * 1e6


def report(cells: list[Cell], clients: list[int], markdown: bool) -> str:
    header = [
        "mode", "clients", "calls/s", "p50 ms", "p99 ms", "errors",
        "app CPU µs/call", "CPU % client/server/pg/other",
    ]  # fmt: skip
    rounds = len({c.round for c in cells}) > 1
    if rounds:
        header.insert(2, "round")
    rows = []
    for cell in sorted(cells, key=lambda c: (MODES.index(c.mode), c.clients, c.round)):
        cpu = "/".join(
            _fmt(cell.cpu[k], 0) if k in cell.cpu else "-"
            for k in ("client", "server", "postgres", "other")
        )
        rows.append(
            [
                cell.mode,
                str(cell.clients),
                *([str(cell.round + 1)] if rounds else []),
                _fmt(cell.rate, 0),
                _fmt(cell.percentile(0.50), 2),
                _fmt(cell.percentile(0.99), 2),
                str(cell.errors),
                _fmt(app_cpu_per_call(cell), 0),
                cpu,
            ]
        )
    return render_table(rows, header, markdown=markdown)


def ratios(cells: list[Cell], clients: list[int]) -> list[str]:
    """Each target's ratio of calls/s at each client count: the median of the ratios
    within each round (both sides measured in the same round)."""
    by = {(c.mode, c.clients, c.round): c.rate for c in cells}
    rounds = sorted({c.round for c in cells})
    lines = []
    targets: dict[str, float | None] = {**TARGETS, **BOUNDS}
    for name, target in targets.items():
        num, den = name.split("/")
        for n in clients:
            values = [
                by[(num, n, r)] / by[(den, n, r)]
                for r in rounds
                if by.get((num, n, r)) and by.get((den, n, r))
            ]
            if not values:
                continue
            value = statistics.median(values)
            each = ""
            if len(values) > 1:
                each = f" (median of {', '.join(f'{v:.2f}' for v in values)})"
            verdict = ""
            if n == TARGET_CLIENTS and target is not None:
                verdict = f"  target >= {target}: {'PASS' if value >= target else 'MISS'}"
            lines.append(f"{num} / {den} at {n:>2} clients: {value:.2f}x{each}{verdict}")
    return lines


async def wait_quiet(limit: float, busy: float = 25.0) -> float:
    """Wait (up to ``limit`` seconds) until the rest of the machine uses less than
    ``busy`` percent of one core over one second; returns the last reading. On a shared
    machine this keeps a cell from measuring someone else's work."""
    deadline = time.monotonic() + limit
    while True:
        before = machine_busy_seconds()
        await asyncio.sleep(1.0)
        reading = 100 * (machine_busy_seconds() - before)
        if reading < busy or time.monotonic() >= deadline:
            return reading


def schedule(modes: list[str], clients: list[int], rounds: int) -> Iterator[tuple[int, int, str]]:
    """(clients, round, mode) in measuring order: each client count's rounds together,
    the modes forward in even rounds and backward in odd ones."""
    for n in clients:
        for r in range(rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                yield n, r, mode


async def main_async(args: argparse.Namespace) -> int:
    modes = [m for m in MODES if m in args.only]
    dbs = ScratchDatabases(args.database_url)
    print(
        f"intake bench: {psutil.cpu_count()} cores, modes {','.join(modes)}, clients "
        f"{','.join(map(str, args.clients))}, {args.seconds:g} s per cell "
        f"(+{args.warmup:g} s warm-up), database {dbs.template}",
        flush=True,
    )
    print(f"http: server {server_flavour()}; client: raw asyncio HTTP/1.1 keep-alive", flush=True)
    cells: list[Cell] = []
    dbs.create_template()
    try:
        for n, round_, mode in schedule(modes, args.clients, args.rounds):
            with dbs.cell() as url:
                if args.wait_quiet:
                    await wait_quiet(args.wait_quiet)
                cell = await RUNNERS[mode](url, n, args.seconds, args.warmup)
            cell.round = round_
            cells.append(cell)
            p50, p99 = _fmt(cell.percentile(0.5), 2), _fmt(cell.percentile(0.99), 2)
            line = (
                f"  {mode:<8} {n:>3} clients: {cell.rate:>8,.0f} calls/s  p50 {p50} ms  "
                f"p99 {p99} ms  app {_fmt(app_cpu_per_call(cell), 0)} µs/call  "
                f"other load {_fmt(cell.cpu.get('other', math.nan), 0)}%"
            )
            print(line + (f"  [{cell.note}]" if cell.note else ""), flush=True)
    finally:
        dbs.drop()
    print()
    print(report(cells, args.clients, markdown=False))
    print()
    for line in ratios(cells, args.clients):
        print(line)
    noisy = [c for c in cells if c.cpu.get("other", 0.0) > NOISY_OTHER_LOAD]
    if noisy:
        print(
            f"warning: {len(noisy)} of {len(cells)} cells shared the machine with other work "
            f"(other load > {NOISY_OTHER_LOAD:.0f}% of a core); their calls/s are low, "
            "app CPU µs/call is the steadier figure. --wait-quiet SECONDS helps."
        )
    print()
    print(report(cells, args.clients, markdown=True))
    return 0 if all(c.calls and not c.errors for c in cells) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.intake", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=1.5, help="unmeasured seconds first")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each cell, wait up to this long for other load to drop below 25%%",
    )
    parser.add_argument(
        "--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64]
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every cell this many times, alternating the order of the modes",
    )
    parser.add_argument(
        "--database-url",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a server where this user may CREATE DATABASE; scratch databases are dropped",
    )
    parser.add_argument(
        "--only",
        type=lambda s: [x for x in s.split(",") if x],
        default=list(MODES),
        help="comma-separated subset of " + ",".join(MODES),
    )
    args = parser.parse_args(argv)
    unknown = set(args.only) - set(MODES)
    if unknown:
        parser.error(f"unknown mode(s): {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    code = asyncio.run(main_async(args))
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
